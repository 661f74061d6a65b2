"""A remote-required pod's whole way, once: the real webhook, extender and controller as
processes against the FAKE API server, the slice server and the sidecar started from the
pods they wrote (kubelet and kube-scheduler played by ``control_path``); the workload uses
its slice, and deleting its pod releases everything the controller made for it."""

from __future__ import annotations

import base64
from pathlib import Path

from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract import annotations as records
from gpupool.contract import names, slices
from gpupool.contract.slices import SliceState, read_status
from gpupool.security import sessions
from tests.waiting import wait_for

from .control_path import CLIENT_NODE, GPU_NODE, SLICES_NS, control_path, seed_objects


def _serial(fake: FakeApiServer, name: str, ns: str) -> int:
    secret = fake.get("secrets", name, ns)
    assert secret is not None, f"Secret {ns}/{name} is missing"
    return sessions.credential_of(base64.b64decode(secret["data"]["tls.crt"]).decode()).serial


def _state(fake: FakeApiServer, meta: dict[str, str]) -> SliceState | None:
    pod = fake.get("pods", meta["name"], meta["namespace"]) or {"metadata": {}}
    status = read_status(pod["metadata"].get("annotations"))
    return status.state if status is not None else None


def _revoked(fake: FakeApiServer) -> frozenset[int]:
    crl = (fake.get("configmaps", "gpupool-slice-revocations", SLICES_NS) or {})["data"]
    ca = fake.get("secrets", "gpupool-slice-ca", SLICES_NS) or {}
    return sessions.revoked_serials(crl["crl.pem"], base64.b64decode(
        ca["data"]["ca.crt"]).decode())


def test_a_pod_created_gets_a_usable_remote_slice_and_its_deletion_releases_it(
        tmp_path: Path) -> None:
    with FakeApiServer() as fake:
        for plural, obj in seed_objects():
            fake.seed(plural, obj)
        with control_path(fake.url, tmp_path) as driver:
            run = driver.run("train")  # usable: alloc, write, read back, checksum answered

            meta = run.pod["metadata"]
            stored = fake.get("pods", meta["name"], meta["namespace"]) or {}
            decision = records.decode(meta["uid"], stored["metadata"]["annotations"]).allocation
            assert stored["spec"]["nodeName"] == CLIENT_NODE  # a node without GPUs
            assert decision.served_by == GPU_NODE
            server_pod = run.server_pod
            assert server_pod["spec"]["nodeName"] == GPU_NODE
            assert f"--gpu-uuid={decision.slices[0].gpu_uuid}" in \
                server_pod["spec"]["containers"][0]["args"]
            limits = stored["spec"]["containers"][0]["resources"]["limits"]
            assert limits[names.RESOURCE_REMOTE_GPU] == "1"  # the webhook's count

            driver.report_ready(run)  # kubelet: the server's readiness probe passed
            assert wait_for(lambda: _state(fake, meta) is SliceState.SERVING)

            slice_name = stored["metadata"]["annotations"][names.ANNOTATION_SLICE]
            issued = {_serial(fake, slices.client_secret(slice_name), meta["namespace"]),
                      _serial(fake, slices.server_secret(slice_name), SLICES_NS)}
            driver.release(run)  # the pod deleted; the controller deleted the server pod
            assert wait_for(lambda: fake.get("services", slices.service_name(slice_name),
                                             SLICES_NS) is None)
            assert wait_for(lambda: fake.get("secrets", slices.server_secret(slice_name),
                                             SLICES_NS) is None)
            assert wait_for(lambda: issued <= _revoked(fake))
            assert run.server is not None and run.server.proc.popen.returncode == 0
            assert "released: the server was asked to stop (SIGTERM)" in \
                run.server.proc.output()
