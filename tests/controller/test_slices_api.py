"""Remote slices' servers through the API: the controller's real client against the FAKE
API server makes the server pod bound to the decided node with the decided GPU and limits,
its Service and both session certificates (bound to the pod's uid, from the slice CA),
follows the server's readiness, and removes everything of a gone pod, revoking its
certificates; the calls it needs are what the chart grants."""

from __future__ import annotations

import base64
import threading
from pathlib import Path
from typing import Any

import yaml
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract import annotations as records
from gpupool.contract import names
from gpupool.contract.slices import SliceState, read_status
from gpupool.controller.loop import Controller
from gpupool.controller.metrics import ControllerMetrics
from gpupool.controller.slicekeeper import SliceKeeper
from gpupool.controller.sliceserver import ServerSettings
from gpupool.controller.slicesplan import Timing
from gpupool.core.allocation import Allocation, Slice
from gpupool.kube.controller_ops import ControllerApi
from gpupool.kube.errors import KubeError
from gpupool.security import sessions
from tests.rbac_grants import Rule, grants, needed, refused, rendered, writes
from tests.waiting import wait_for
from tests.webhook.builders import review
from tests.webhook.cel import Outcome, Policy

from .builders import device, sign

NS = "gpupool-slices"
SLICE = "0123456789abcdef"
SETTINGS = ServerSettings("stub", NS, "reg.example/gpupool:1")
CONTROLLER = "system:serviceaccount:gpupool-system:gpupool-controller"


def remote_pod(uid: str = "uid-lab-train") -> dict[str, Any]:
    alloc = Allocation(uid, "cpu-node", 1000, 1024,
                       (Slice("GPU-g1-0", 0, 4096, 30, "main"),), False, "g1")
    return workload("train", alloc, "remote-required", SLICE, names.RESOURCE_REMOTE_GPU)


def workload(name: str, alloc: Allocation, placement: str, slice_name: str, count: str
             ) -> dict[str, Any]:
    """A bound, running pod in ``lab`` with the signed decision ``alloc``, asking one GPU
    of 4096 MiB and 30 % as ``count``."""
    notes = records.encode(alloc, "2026-01-01T00:00:00Z")
    notes.update({names.ANNOTATION_PLACEMENT: placement, names.ANNOTATION_SLICE: slice_name})
    return sign({"metadata": {"name": name, "namespace": "lab", "uid": alloc.key,
                              "annotations": notes},
                 "spec": {"nodeName": alloc.node, "containers": [{
                     "name": "main", "image": "train", "resources": {"limits": {
                         count: "1", names.RESOURCE_MEMORY: "4096",
                         names.RESOURCE_CORE: "30"}}}]},
                 "status": {"phase": "Running"}})


def verify(uid: str, namespace: str, name: str, annotations: Any, signature: str | None
           ) -> str:
    from .builders import verify as checked
    return checked(uid, namespace, name, annotations, signature)


def server_pods(fake: FakeApiServer) -> list[dict[str, Any]]:
    return [p for p in fake.objects("pods") if p["metadata"]["namespace"] == NS]


def status_of(fake: FakeApiServer) -> Any:
    pod = fake.get("pods", "train", "lab")
    return read_status(pod["metadata"]["annotations"]) if pod else None


def test_a_remote_slice_is_served_followed_and_released_with_its_credentials(
        tmp_path: Path) -> None:
    metrics = ControllerMetrics()
    with FakeApiServer() as fake:
        obj = device("g1", 0)
        obj["status"]["isolationProvider"] = "hami-core"
        fake.seed("gpudevices", obj)
        fake.seed("pods", remote_pod())
        api = ControllerApi.open(server=fake.url)
        keeper = SliceKeeper(api, SETTINGS, Timing(lifetime_s=600), host="test",
                             report=metrics.slices_kept)
        stop = threading.Event()
        thread = threading.Thread(target=Controller(api, verify=verify, slices=keeper).run,
                                  args=(stop, 60.0, None, 1))
        thread.start()
        try:
            assert wait_for(lambda: server_pods(fake) and status_of(fake) is not None)
            (server,) = server_pods(fake)
            spec = server["spec"]
            assert spec["nodeName"] == "g1" and server["metadata"]["name"] == \
                f"gpupool-slice-{SLICE}-1"
            args = spec["containers"][0]["args"]
            assert {"--gpu-uuid=GPU-g1-0", "--memory-mib=4096", "--core-pct=30",
                    "--pod-uid=uid-lab-train", "--isolation-provider=hami-core"} <= set(args)
            assert status_of(fake).state is SliceState.STARTING
            marked = fake.get("pods", "train", "lab")
            assert fake.get("services", f"gpupool-slice-{SLICE}", NS)["spec"]["selector"] == {
                "gpupool.io/slice": SLICE, "gpupool.io/pod-uid": "uid-lab-train"}
            client = _secret(fake, "lab", f"gpupool-slice-{SLICE}")
            owner = client["metadata"]["ownerReferences"][0]
            assert (owner["kind"], owner["uid"]) == ("Pod", "uid-lab-train")
            ca = _secret(fake, NS, "gpupool-slice-ca")
            cred = sessions.credential_of(_data(client, "tls.crt"))
            assert cred.uris == ("spiffe://gpupool.io/pod/uid-lab-train",) and cred.client
            assert _data(client, "ca.crt") == _data(ca, "ca.crt")
            srv = sessions.credential_of(_data(_secret(fake, NS, f"gpupool-slice-{SLICE}-server"),
                                               "tls.crt"))
            assert srv.uris == ("spiffe://gpupool.io/slice-server/uid-lab-train",)
            # the kubelet reports the server ready
            fake.patch_status("pods", server["metadata"]["name"], {
                "phase": "Running", "conditions": [{"type": "Ready", "status": "True",
                                                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]
            }, NS)
            assert wait_for(lambda: status_of(fake).state is SliceState.SERVING)
            assert wait_for(lambda: "GpupoolSliceServing" in {
                e["reason"] for e in fake.objects("events")})  # written after the status
            # the workload's pod goes: everything of its slice goes, certificates revoked
            fake.delete("pods", "train", "lab")
            assert wait_for(lambda: not server_pods(fake) and not fake.objects("services"))
            assert wait_for(lambda: fake.get("secrets", f"gpupool-slice-{SLICE}-server", NS)
                            is None)
            assert wait_for(lambda: {cred.serial, srv.serial} <= revoked(fake, ca))
        finally:
            stop.set()
            thread.join(30)
            api.close()
        calls = needed(fake.requests)
    assert metrics.remote_slices.labels("serving")._value.get() in (0, 1)
    rules = chart_grants(tmp_path)
    assert refused(calls, rules) == set()
    assert {("", "pods"), ("", "services"), ("", "secrets")} <= writes(calls)
    # in workloads' namespaces: Secrets written, never read or listed; pods patched only
    outside = {(c.resource, c.verb) for c in calls if c.namespace not in (NS, "")}
    assert outside <= {("secrets", "create"), ("secrets", "update"), ("pods", "patch"),
                       ("events", "create")}
    # what it wrote passes the chart's admission policies on its pods
    policies = {d["metadata"]["name"]: Policy(d) for d in yaml.safe_load_all(rendered(
        tmp_path, "remote.provider=stub", f"remote.server.image={SETTINGS.image}").read_text())
        if d and d["kind"] == "ValidatingAdmissionPolicy"}
    made = review(server, user=CONTROLLER, namespace=NS)["request"]
    assert policies["gpupool-controller-slice-servers"].admit(made) == Outcome(True, True)
    status = review(marked, operation="UPDATE", old=remote_pod(), user=CONTROLLER,
                    namespace="lab")["request"]
    assert policies["gpupool-annotation-writers"].admit(status) == Outcome(True, True)


def chart_grants(tmp: Path) -> list[Rule]:
    """The controller's rules as the chart renders them with remote slices on."""
    return grants(rendered(tmp, "remote.provider=stub"), "gpupool-controller")


def revoked(fake: FakeApiServer, ca: dict[str, Any]) -> frozenset[int]:
    crl = fake.get("configmaps", "gpupool-slice-revocations", NS)["data"]["crl.pem"]
    return sessions.revoked_serials(crl, _data(ca, "ca.crt"))


def _secret(fake: FakeApiServer, ns: str, name: str) -> dict[str, Any]:
    obj = fake.get("secrets", name, ns)
    assert obj is not None, f"Secret {ns}/{name} is missing"
    return obj


def _data(secret: dict[str, Any], key: str) -> str:
    return base64.b64decode(secret["data"][key]).decode()


def allowed_pod(name: str, served_by: str) -> dict[str, Any]:
    """A remote-allowed pod on GPU node ``home`` (its count is the node's devices), served
    by a slice server on ``served_by``, or by its own devices ("": a version-1 decision)."""
    alloc = Allocation(f"uid-lab-{name}", "home", 1000, 1024,
                       (Slice(f"GPU-{served_by or 'home'}-0", 0, 4096, 30, "main"),), False,
                       served_by)
    return workload(name, alloc, "remote-allowed", f"{len(name):016x}", names.RESOURCE_GPU)


def test_a_remote_allowed_pod_gets_a_server_only_when_its_slice_is_served_elsewhere() -> None:
    with FakeApiServer() as fake:
        fake.seed("gpudevices", device("g1", 0))
        fake.seed("gpudevices", device("home", 0))
        fake.seed("pods", allowed_pod("far", "g1"))
        fake.seed("pods", allowed_pod("near", ""))
        api = ControllerApi.open(server=fake.url)
        keeper = SliceKeeper(api, SETTINGS, Timing(lifetime_s=600), host="test")
        stop = threading.Event()
        thread = threading.Thread(target=Controller(api, verify=verify, slices=keeper).run,
                                  args=(stop, 60.0, None, 1))
        thread.start()
        try:
            assert wait_for(lambda: len(server_pods(fake)) == 1)
            (server,) = server_pods(fake)
            assert server["spec"]["nodeName"] == "g1"
            assert {"--gpu-uuid=GPU-g1-0", "--pod-uid=uid-lab-far"} <= set(
                server["spec"]["containers"][0]["args"])
            assert server["metadata"]["name"] == f"gpupool-slice-{3:016x}-1"
            assert _secret(fake, "lab", f"gpupool-slice-{3:016x}")  # the sidecar's, issued
            assert fake.get("secrets", f"gpupool-slice-{4:016x}", "lab") is None  # "near"
        finally:
            stop.set()
            thread.join(30)
            api.close()


def test_a_failed_revocation_write_keeps_the_secrets_and_revokes_them_next_round() -> None:
    """A server Secret is the only record of its slice's serials: it goes only once they
    are in the revocation list, and is found again when no pod is left."""
    with FakeApiServer() as fake:
        devices = [device("g1", 0)]
        fake.seed("gpudevices", devices[0])
        pod = remote_pod()
        fake.seed("pods", pod)
        api = ControllerApi.open(server=fake.url)
        try:
            keeper = SliceKeeper(api, SETTINGS, Timing(lifetime_s=600), host="test")

            def keep_round() -> None:
                pods = fake.objects("pods")
                keeper.keep(observe_pods(devices, pods), pods, devices)

            keep_round()
            server = fake.get("secrets", f"gpupool-slice-{SLICE}-server", NS)
            client = fake.get("secrets", f"gpupool-slice-{SLICE}", "lab")
            serials = {sessions.credential_of(base64.b64decode(s["data"]["tls.crt"]).decode())
                       .serial for s in (server, client)}
            real = api.put_config_map_data

            def failing(*args: Any, **kwargs: Any) -> None:
                raise KubeError("the API server answered 500")
            api.put_config_map_data = failing  # type: ignore[method-assign]
            fake.delete("pods", "train", "lab")
            keep_round()  # the revocation list cannot be written this round
            assert fake.get("secrets", f"gpupool-slice-{SLICE}-server", NS) is not None
            api.put_config_map_data = real  # type: ignore[method-assign]
            keep_round()
            keep_round()
            crl = fake.get("configmaps", "gpupool-slice-revocations", NS)["data"]["crl.pem"]
            ca = fake.get("secrets", "gpupool-slice-ca", NS)
            revoked = sessions.revoked_serials(
                crl, base64.b64decode(ca["data"]["ca.crt"]).decode())
            assert serials <= revoked
            assert fake.get("secrets", f"gpupool-slice-{SLICE}-server", NS) is None
        finally:
            api.close()


def observe_pods(devices: list[dict[str, Any]], pods: list[dict[str, Any]]) -> Any:
    from gpupool.controller.observed import observe

    from .builders import verify
    return observe(devices, [], [], pods, verify)
