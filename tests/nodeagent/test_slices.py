"""Remote slices served on this node, in the over-use monitor: a slice server's /usage
(read over real HTTP) becomes its workload container's observation, an over-user is
acted on through the server pod (the only pod of it on this node), and a server that does
not answer is skipped, counted."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpupool.controller.sliceserver import Served, ServerSettings, server_pod
from gpupool.core.allocation import Allocation, Slice
from gpupool.nodeagent.monitor import MonitorConfig, UsageMonitor
from gpupool.nodeagent.overuse import Changes, OveruseConfig, OveruseTracker
from gpupool.nodeagent.pods import Pod, pod_from_json
from gpupool.nodeagent.slices import SliceAttribution, fetch_usage
from gpupool.nodeagent.verify import DecisionGate

NS = "gpupool-slices"
SERVED = Served("u-train", "lab", "train", "0123456789abcdef",
                Allocation("u-train", "cpu-a", 1000, 1024,
                           (Slice("GPU-g1-0", 0, 4096, 30, "main"),), False, "g1"))


def server(ip: str) -> Pod:
    """The server pod the controller makes, as the node agent's informer shows it."""
    obj = server_pod(SERVED, 1, ServerSettings("stub", NS, "img"), "none")
    obj["metadata"]["uid"] = "u-server"
    obj["status"] = {"phase": "Running", "podIP": ip}
    return pod_from_json(obj)


@pytest.fixture
def usage_server() -> Iterator[tuple[str, int, list[dict[str, Any]]]]:
    """A loopback HTTP server answering /usage with the records the test sets."""
    records: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(records).encode()
            self.send_response(200 if self.path == "/usage" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield "127.0.0.1", httpd.server_address[1], records
    httpd.shutdown()
    httpd.server_close()


def record(memory_mib: int, sm_pct: int | None) -> dict[str, Any]:
    return {"pod_uid": "u-train", "pod_ref": "lab/train", "container": "main",
            "gpu_uuid": "GPU-g1-0", "memory_mib": memory_mib, "sm_pct": sm_pct,
            "memory_limit_mib": 4096, "core_limit_pct": 30, "exclusive": False}


def monitor(pods: list[Pod], fetch: Any, acted: list[tuple[Changes, dict[str, Pod]]]
            ) -> UsageMonitor:
    return UsageMonitor(MonitorConfig("g1", Path("/nonexistent")), lambda: [], lambda: pods,
                        DecisionGate("g1", None), OveruseTracker(OveruseConfig(grace_s=0)),
                        lambda c, by_uid: acted.append((c, by_uid)), clock=lambda: 100.0,
                        attribution=lambda p: SliceAttribution(Path("/nonexistent"), p, {},
                                                               NS, fetch))


def test_a_slice_servers_usage_is_its_workloads_and_an_over_user_is_acted_on_through_it(
        usage_server: tuple[str, int, list[dict[str, Any]]]) -> None:
    ip, port, records = usage_server
    records.append(record(5000, 20))  # over its 4096 MiB
    pod = server(ip)
    acted: list[tuple[Changes, dict[str, Pod]]] = []
    mon = monitor([pod], lambda addr: fetch_usage(addr, port), acted)
    changes = mon.sample_once()
    (seen,) = mon.last
    assert (seen.pod_uid, seen.pod_ref, seen.container, seen.gpu_uuid, seen.memory_mib,
            seen.memory_limit_mib, seen.core_limit_pct) == (
        "u-train", "lab/train", "main", "GPU-g1-0", 5000, 4096, 30)
    assert [o.seen.key for o in changes.started] == [("u-train", "main", "GPU-g1-0")]
    _, by_uid = acted[0]
    assert by_uid["u-train"] is pod  # the actions write and evict the server pod
    records[0] = record(1000, 20)
    assert [o.seen.key for o in mon.sample_once().ended] == [("u-train", "main", "GPU-g1-0")]


def test_a_silent_server_is_skipped_and_counted() -> None:
    def silent(ip: str) -> list[dict[str, Any]]:
        raise OSError("connection refused")

    seen = SliceAttribution(Path("/nonexistent"), [server("10.0.0.9")], {}, NS, silent)
    assert seen.observe([]) == ([], frozenset())
    assert seen.skipped == {"slice-server-silent": 1}


def test_a_pod_outside_the_slices_namespace_is_never_taken_for_a_server() -> None:
    pod = server("10.0.0.9")
    mimic = Pod(**{**{f: getattr(pod, f) for f in pod.__dataclass_fields__},
                   "namespace": "lab", "uid": "u-mimic"})
    seen = SliceAttribution(Path("/nonexistent"), [mimic], {}, NS, lambda ip: [record(1, 1)])
    assert seen.servers == {} and seen.observe([]) == ([], frozenset())


def test_the_usage_read_follows_no_redirect_and_no_proxy(
        usage_server: tuple[str, int, list[dict[str, Any]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A server pod's status port answers only for itself: a redirect (a server pod taken
    over by its provider, say) is not followed from the node agent's network position,
    and the environment's proxy is not asked to reach a pod address."""
    ip, port, records = usage_server
    records.append(record(1000, 20))

    class Redirect(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", f"http://{ip}:{port}/usage")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        with pytest.raises(OSError, match="302"):
            fetch_usage("127.0.0.1", httpd.server_address[1])
    finally:
        httpd.shutdown()
        httpd.server_close()
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:1")  # nothing listens there
    monkeypatch.setenv("no_proxy", "")
    assert fetch_usage(ip, port) == [record(1000, 20)]


def test_a_remote_burstable_slice_is_judged_by_its_request_and_limit_as_a_local_one() -> None:
    """Its server enforces the limit; the node agent must know the request too, or the
    burst would count as granted: never reclaimed, and the neighbours' bursts reclaimed
    to make room for it."""
    bursting = Served("u-train", "lab", "train", "0123456789abcdef",
                      Allocation("u-train", "cpu-a", 1000, 1024, (Slice(
                          "GPU-g1-0", 0, 4096, 30, "main", 4096, 20),), False, "g1"))
    obj = server_pod(bursting, 1, ServerSettings("stub", NS, "img"), "none")
    obj["metadata"]["uid"] = "u-server"
    obj["status"] = {"phase": "Running", "podIP": "10.0.0.9"}
    seen = SliceAttribution(Path("/nonexistent"), [pod_from_json(obj)], {}, NS,
                            lambda ip: [record(6000, 40)])
    ((o,), _) = seen.observe([])
    assert (o.memory_limit_mib, o.memory_request_mib, o.core_limit_pct, o.core_request_pct) \
        == (8192, 4096, 50, 30)
    held = seen.servers["u-server"].held_slice()
    assert (held.memory_mib, held.burst_memory_mib, held.core_pct, held.burst_core_pct) == \
        (4096, 4096, 30, 20)
