"""The remote-slice data path end to end, as real processes on loopback.

``gpupool slice-server --provider stub`` (with the STUB provider as its own child
process) and ``gpupool slice-client`` over mutual TLS; the test is the workload, talking
the stub protocol to the sidecar's data plane. Its usage reaches the node agent's
usage monitor (tracker, actions, per-container metrics) through the server's /usage;
heartbeat loss makes the sidecar report the server lost, and the server release the
slice of a sidecar that is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract import annotations as records
from gpupool.contract import names
from gpupool.core.allocation import Allocation, Slice
from gpupool.kube.api import KubeApi
from gpupool.nodeagent.actions import ANNOTATION_OVER_USE, Actions, OveruseAction
from gpupool.nodeagent.kubeview import KubeEvents, KubePods
from gpupool.nodeagent.metrics import NodeMetrics
from gpupool.nodeagent.monitor import MonitorConfig, UsageMonitor
from gpupool.nodeagent.overuse import Observation, OveruseConfig, OveruseTracker
from gpupool.remote.stubclient import StubClient, StubRefused
from tests.ports import free_port
from tests.waiting import wait_for

from .builders import GPU, MIB, POD_UID, Authority

BEAT, DEADLINE = "0.2", "1.5"
CLIENT_NODE = "cpu-node-1"  # the workload's node has no GPU


class Proc:
    """A gpupool command as its own process, with its status endpoint."""

    def __init__(self, args: Sequence[str], status_port: int, log: Path):
        self.status_port = status_port
        self.log = log
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "gpupool.cli.main", *args, "--status-address", "127.0.0.1",
             "--status-port", str(status_port), "--heartbeat-seconds", BEAT,
             "--heartbeat-deadline-seconds", DEADLINE],
            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)

    def get(self, path: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.status_port}{path}",
                                        timeout=5) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())
        except OSError:
            return 0, None

    def output(self) -> str:
        return self.log.read_text()

    def stop(self) -> None:
        """Kill the command and what it started (the provider is in its process group)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(30)


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for p in started:
        p.stop()


def slice_server(procs: list[Proc], tmp: Path, authority: Authority, port: int,
                 name: str = "server") -> Proc:
    proc = Proc(["slice-server", "--pod-uid", POD_UID, "--pod-name", "default/trainer",
                 "--container", "main", "--gpu-uuid", GPU, "--memory-mib", "1",
                 "--core-pct", "10", "--host", "127.0.0.1", "--port", str(port),
                 "--credentials-dir", str(authority.server(name=name)),
                 "--loopback-port", str(free_port()), "--provider", "stub"],
                free_port(), tmp / f"{name}.log")
    procs.append(proc)
    return proc


def sidecar(procs: list[Proc], tmp: Path, authority: Authority, server_port: int,
            *more: str, credentials: Path | None = None) -> tuple[Proc, int]:
    data = free_port()
    proc = Proc(["slice-client", "--pod-uid", POD_UID, "--slice-server",
                 f"127.0.0.1:{server_port}", "--credentials-dir",
                 str(credentials or authority.client()), "--host", "127.0.0.1", "--port",
                 str(data), *more], free_port(), tmp / "client.log")
    procs.append(proc)
    return proc, data


def ready(proc: Proc) -> bool:
    return proc.get("/ready")[0] == 200


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


class RemoteUsage:
    """What the monitor reads for remote slices: each slice server's /usage records."""

    def __init__(self, servers: Sequence[Proc]):
        self.skipped: dict[str, int] = {}
        self.servers = servers

    def observe(self, usage: object) -> tuple[list[Observation], frozenset[str]]:
        records = [r for s in self.servers for r in s.get("/usage")[1] or []]
        return [Observation(**r) for r in records], frozenset()


@pytest.fixture
def cluster() -> Iterator[tuple[FakeApiServer, KubeApi]]:
    with FakeApiServer() as api:
        api.seed("pods", {"apiVersion": "v1", "kind": "Pod",
                          "metadata": {"name": "trainer", "namespace": "default",
                                       "uid": POD_UID, "annotations": {}},
                          "spec": {"nodeName": CLIENT_NODE, "containers": [
                              {"name": "main", "image": "cuda"}]},
                          "status": {"phase": "Running"}})
        kube = KubeApi.connect(server=api.url)
        yield api, kube
        kube.close()


def test_a_workload_on_a_node_without_gpus_uses_its_remote_slice_within_its_limits(
        tmp_path: Path, procs: list[Proc], cluster: tuple[FakeApiServer, KubeApi]) -> None:
    authority = Authority(tmp_path)
    port = free_port()
    server = slice_server(procs, tmp_path, authority, port)
    client, data = sidecar(procs, tmp_path, authority, port)
    assert wait_for(lambda: ready(client)), client.output() + server.output()

    with StubClient("127.0.0.1", data) as workload:
        assert workload.hello()["device"] == GPU  # the provider is pinned to the decided GPU
        h = workload.alloc(MIB)
        workload.write(h, b"\x01" * 1024)
        with pytest.raises(StubRefused, match="out-of-memory"):
            workload.alloc(1)  # more than its 1 MiB slice: refused by the server side
        with pytest.raises(StubRefused, match="out-of-range"):
            workload.write(h, b"x" * 2, offset=MIB - 1)
        until = time.monotonic() + 2.0
        while time.monotonic() < until:  # keep the "GPU" busy: far beyond a 10 % share
            workload.checksum(h, rounds=20)

    code, records = server.get("/usage")
    assert code == 200 and len(records) == 1
    assert records[0]["memory_mib"] == 1 and records[0]["memory_limit_mib"] == 1
    assert records[0]["sm_pct"] is not None and records[0]["sm_pct"] > 10, records

    api, kube = cluster
    pods = KubePods(kube)
    metrics = NodeMetrics()
    monitor = UsageMonitor(
        MonitorConfig("gpu-node-1"), usage=lambda: (),
        pods=lambda: pods.node_pods(CLIENT_NODE), gate=None,  # type: ignore[arg-type]
        tracker=OveruseTracker(OveruseConfig(grace_s=0, compute_tolerance_pct=0)),
        on_changes=Actions(OveruseAction.WARN, pods, KubeEvents(kube, "gpu-node-1")),
        metrics=metrics, attribution=lambda _pods: RemoteUsage([server]))  # type: ignore[arg-type,return-value]
    changes = monitor.sample_once()

    assert [o.seen.pod_uid for o in changes.started] == [POD_UID]
    events = [e["message"] for e in api.objects("events") if e["reason"] == "GpupoolOverUse"]
    assert len(events) == 1 and "of the GPU's compute (slice 10 %)" in events[0]
    assert GPU in events[0] and "action: warn" in events[0]
    pod = api.get("pods", "trainer", "default") or {}
    flagged = json.loads(pod["metadata"]["annotations"][ANNOTATION_OVER_USE])
    assert flagged["main"]["gpu"] == GPU and flagged["main"]["computeLimitPct"] == 10
    labels = {"namespace": "default", "pod": "trainer", "container": "main", "gpu": GPU}
    assert metrics.registry.get_sample_value("gpupool_node_container_memory_used_mib",
                                             labels) == 1
    assert metrics.registry.get_sample_value("gpupool_node_container_over_use",
                                             labels) == 1


def test_heartbeats_lost_both_ways_a_lost_server_and_a_released_slice(
        tmp_path: Path, procs: list[Proc]) -> None:
    authority = Authority(tmp_path)
    port = free_port()
    server = slice_server(procs, tmp_path, authority, port)
    client, data = sidecar(procs, tmp_path, authority, port)
    assert wait_for(lambda: ready(client)), client.output() + server.output()

    os.killpg(server.popen.pid, signal.SIGSTOP)  # the server stops answering
    try:
        assert wait_for(lambda: client.get("/status")[1]["state"] == "lost")
        code, body = client.get("/ready")
        assert code == 503 and "no heartbeat for 1.5 s" in body["reason"], body
        with StubClient("127.0.0.1", data, timeout_s=5) as workload, \
                pytest.raises(ConnectionError):
            workload.hello()  # the data plane refuses while the server is lost
    finally:
        os.killpg(server.popen.pid, signal.SIGKILL)
    server.popen.wait(30)

    again = slice_server(procs, tmp_path, authority, port, name="server-2")  # placed again
    assert wait_for(lambda: ready(client)), client.output() + again.output()
    with StubClient("127.0.0.1", data) as workload:
        assert workload.usage()["memory_bytes"] == 0  # the state on the GPU is gone
    provider = again.get("/status")[1]["provider_pid"]
    assert alive(provider)

    os.killpg(client.popen.pid, signal.SIGKILL)  # the workload's pod is gone
    assert again.popen.wait(30) == 0
    said = again.output()
    assert "released: no heartbeat from the client for" in said, said
    assert not alive(provider)  # nothing held: the provider and its memory are gone


def allocation(served_by: str) -> str:
    """The pod's ``gpupool.io/allocation`` as bind writes it (served by its own node's
    devices when ``served_by`` is empty)."""
    alloc = Allocation(POD_UID, CLIENT_NODE, 1000, 1024,
                       (Slice(GPU, 0, 1, 10, "main"),), served_by=served_by)
    return records.encode(alloc, "2026-01-01T00:00:00Z")[names.ANNOTATION_ALLOCATION]


def test_a_remote_allowed_pods_sidecar_idles_when_its_own_node_serves_it(
        tmp_path: Path, procs: list[Proc]) -> None:
    """No server, no credentials (its optional Secret was never issued): ready at once."""
    client, data = sidecar(procs, tmp_path, Authority(tmp_path), free_port(),
                           "--decision", allocation(""), credentials=tmp_path / "none")
    assert wait_for(lambda: ready(client)), client.output()
    assert client.get("/status")[1]["state"] == "local"
    with pytest.raises(OSError):  # no data plane in the pod
        StubClient("127.0.0.1", data).hello()


def test_a_remote_allowed_pods_sidecar_serves_a_slice_placed_elsewhere_once_issued(
        tmp_path: Path, procs: list[Proc]) -> None:
    """Its credentials come after it started (the controller issues them once it sees the
    decision): it waits, saying why, then connects to the slice server and serves."""
    authority = Authority(tmp_path)
    port = free_port()
    server = slice_server(procs, tmp_path, authority, port)
    later = tmp_path / "issued-later"
    client, data = sidecar(procs, tmp_path, authority, port, "--decision",
                           allocation("gpu-node-1"), credentials=later)
    assert wait_for(lambda: "credentials are not there yet" in str(
        client.get("/status")[1])), client.output()
    assert not ready(client)
    authority.client(name=later.name)  # the Secret's files appear in the volume
    assert wait_for(lambda: ready(client)), client.output() + server.output()
    with StubClient("127.0.0.1", data) as workload:
        assert workload.hello()["device"] == GPU
        with pytest.raises(StubRefused, match="out-of-memory"):
            workload.alloc(2 * MIB)  # the slice's limits hold as for remote-required
