"""Node agent benchmark (not a test: it prints figures).

Runs the real agent (gRPC over unix sockets, the FAKE GPU backend, the FAKE
API server over HTTP on loopback, the FAKE kubelet from tests/nodeagent) on a
node of 8 GPUs × 10 logical devices and measures:

* Allocate latency (kubelet's view: the Allocate RPC) over ``--pods`` pods
  admitted one after another with extender decisions, ~40 pods on the node at
  any time — once with the agent in its own process (``gpupool
  device-plugin``, as deployed: the API server and kubelet are other
  processes), once with everything in this one process (agent, FAKE API
  server and FAKE kubelet sharing one interpreter lock: a worst case);
  baseline measured in the same run: one empty gRPC round trip
  (GetDevicePluginOptions), one pod list from the API server, one PodResources
  List — the I/O one Allocate must do;
* the two-pods race: ``--race-runs`` runs of two pods bound at once and
  admitted in random order (tests/nodeagent/test_race.py), with kubelet's
  PodResources API (the handshake) and without it (oldest-pod guessing, the
  fallback) — how many runs give both pods exactly their decided GPUs;
* fault → ListAndWatch latency: a GPU injected unhealthy until kubelet's
  stream shows its logical devices Unhealthy, and recovery → Healthy again;
  both for in-process injection and for an edit of the fake GPU file (polled).

Targets (issue 4): Allocate p99 ≤ 10 ms; fault and recovery ≤ 1 s.

    .venv/bin/python bench/bench_nodeagent.py [--pods 400] [--faults 20] [--race-runs 100]
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "testing"))  # gpupool_testing: the fake API server

from gpupool_testing.fake_apiserver import FakeApiServer  # noqa: E402
from nodeagent.builders import NODE, decision, pod, uuid_of, write_gpus  # noqa: E402
from nodeagent.kubelet_standin import FakeKubelet  # noqa: E402
from nodeagent.test_race import random_pod  # noqa: E402

from gpupool.kube.api import KubeApi  # noqa: E402
from gpupool.nodeagent.agent import AgentConfig, NodeAgent  # noqa: E402
from gpupool.nodeagent.fakegpus import FakeGpuBackend  # noqa: E402
from gpupool.nodeagent.kubeview import KubePods  # noqa: E402
from gpupool.nodeagent.logical import Split  # noqa: E402
from gpupool.nodeagent.podresources import PodResourcesClient  # noqa: E402
from gpupool.nodeagent.proto import deviceplugin_pb2 as dp  # noqa: E402

GPUS, SPLIT = 8, 10
ON_NODE = 40  # pods kept on the node while measuring


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def timed(fn: Callable[[], Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def bench_allocate(kubelet: FakeKubelet, api: FakeApiServer, pods: int) -> list[float]:
    rng = random.Random(42)
    live: list[str] = []
    for n in range(pods):
        g = n % GPUS  # 5 live pods per GPU: room stays in every GPU
        name = f"p{n}"
        p = pod(name, [("main", 1, 1024, 2)], ann=decision(name, [(uuid_of(g), g, 1024, 2,
                                                                    "main")]))
        api.seed("pods", p)
        kubelet.admit(p, rng)
        live.append(name)
        if len(live) > ON_NODE:
            old = live.pop(0)
            kubelet.forget(f"default/{old}")
            api.delete("pods", old, "default")
    return kubelet.allocate_seconds


def fault_latency(kubelet: FakeKubelet, agent: NodeAgent, healthy: bool, inject: Callable[[], None]
                  ) -> float:
    uuid = uuid_of(3)
    ids = [d.id for d in agent.pool.devices() if d.gpu_uuid == uuid]
    want = "Healthy" if healthy else "Unhealthy"
    start = time.monotonic()
    inject()
    update = kubelet.wait_update(lambda d: all(d[i][0] == want for i in ids)
                                 and kubelet.updates[-1].devices is d, timeout=5)
    return update.at - start


def edit_file(path: Path, healthy: bool) -> None:
    """What a person does: edit the GPU's entry in the fake GPU file."""
    body = yaml.safe_load(path.read_text())
    for entry in body["gpus"]:
        if entry["uuid"] == uuid_of(3):
            entry["health"] = "Healthy" if healthy else "Unhealthy"
    path.write_text(yaml.safe_dump(body, sort_keys=False))


def bench_faults(kubelet: FakeKubelet, agent: NodeAgent, n: int) -> dict[str, list[float]]:
    backend = agent.backend
    assert isinstance(backend, FakeGpuBackend)
    out: dict[str, list[float]] = {k: [] for k in ("inject fault", "inject recovery",
                                                   "file fault", "file recovery")}
    for _ in range(n):
        out["inject fault"].append(fault_latency(
            kubelet, agent, False, lambda: backend.set_health(uuid_of(3), False, "XID 79")))
        out["inject recovery"].append(fault_latency(
            kubelet, agent, True, lambda: backend.set_health(uuid_of(3), True)))
        time.sleep(0.01)
        out["file fault"].append(fault_latency(
            kubelet, agent, False, lambda: edit_file(backend.path, False)))
        time.sleep(0.01)
        out["file recovery"].append(fault_latency(
            kubelet, agent, True, lambda: edit_file(backend.path, True)))
    return out


def baseline(kubelet: FakeKubelet, api_url: str, root: Path) -> dict[str, float]:
    stub = kubelet.stub()
    client = KubeApi.connect(server=api_url)
    pods = KubePods(client)
    res = PodResourcesClient(root / "pod-resources" / "kubelet.sock", "gpupool.io/gpu")
    try:
        return {
            "empty gRPC call": statistics.median(timed(
                lambda: stub.GetDevicePluginOptions(dp.Empty()), 200)),
            "pod list (API)": statistics.median(timed(lambda: pods.node_pods(NODE), 200)),
            "PodResources List": statistics.median(timed(res.holders, 200)),
        }
    finally:
        client.close()
        res.close()


def race(runs: int, pod_resources: bool) -> int:
    """Runs (of ``runs``) in which both pods got exactly their decided GPUs."""
    root = Path(tempfile.mkdtemp(prefix="gpr-", dir="/tmp"))
    rng = random.Random(20260101)
    correct = 0
    with FakeApiServer() as api:
        kubelet = FakeKubelet(root / "kubelet", serve_pod_resources=pod_resources).start()
        client = KubeApi.connect(server=api.url)
        pods = KubePods(client)
        agent = NodeAgent(AgentConfig(NODE, root / "kubelet", Split(8), watch_s=0.05),
                          FakeGpuBackend(write_gpus(root / "gpus.yaml", 4)), pods)
        pods.start(NODE)
        agent.start()
        try:
            kubelet.wait_registrations(1)
            for run in range(runs):
                correct += race_once(run, rng, kubelet, api)
        finally:
            agent.stop()
            pods.stop(wait=False)
            kubelet.stop()
            client.close()
    return correct


def race_once(run: int, rng: random.Random, kubelet: FakeKubelet, api: FakeApiServer) -> bool:
    exclusive: set[int] = set()
    shared: set[int] = set()
    times = ["2026-01-01T00:00:01Z", "2026-01-01T00:00:02Z"]
    rng.shuffle(times)
    order = [random_pod(f"{c}{run}", rng, exclusive, shared, t)
             for c, t in zip("ab", times, strict=True)]
    for p, _ in order:
        api.seed("pods", p)
    rng.shuffle(order)
    ok = True
    for p, want in order:
        try:
            envs = kubelet.admit(p, rng).envs
            ok &= all(sorted(envs[c]["NVIDIA_VISIBLE_DEVICES"].split(",")) == sorted(u)
                      for c, u in want.items())
        except Exception:  # a refusal or a failed start counts as a wrong run
            ok = False
    for p, _ in order:
        kubelet.forget(f"default/{p['metadata']['name']}")
        api.delete("pods", p["metadata"]["name"], "default")
    return ok


def allocate_in_own_process(pods: int) -> list[float]:
    """Allocate latencies with the agent run as ``gpupool device-plugin`` in a subprocess."""
    root = Path(tempfile.mkdtemp(prefix="gps-", dir="/tmp"))
    with FakeApiServer() as api:
        kubelet = FakeKubelet(root / "kubelet").start()
        gpus = write_gpus(root / "gpus.yaml", GPUS, 81920)
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpupool.cli.main", "device-plugin", "--node-name", NODE,
             "--api-server", api.url, "--kubelet-dir", str(kubelet.root), "--fake-gpus",
             str(gpus), "--split", str(SPLIT), "--log-level", "ERROR"])
        try:
            kubelet.wait_registrations(1, timeout=60)
            kubelet.wait_update(lambda d: len(d) == GPUS * SPLIT)
            return bench_allocate(kubelet, api, pods)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            kubelet.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=400)
    parser.add_argument("--faults", type=int, default=20)
    parser.add_argument("--race-runs", type=int, default=100)
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # refusals and fallbacks are expected here; figures only
    root = Path(tempfile.mkdtemp(prefix="gpb-", dir="/tmp"))
    with FakeApiServer() as api:
        kubelet = FakeKubelet(root / "kubelet").start()
        client = KubeApi.connect(server=api.url)
        config = AgentConfig(NODE, root / "kubelet", Split(SPLIT), watch_s=0.05)
        pods = KubePods(client)
        agent = NodeAgent(config, FakeGpuBackend(write_gpus(root / "gpus.yaml", GPUS, 81920)),
                          pods)
        pods.start(NODE)
        agent.start()
        try:
            kubelet.wait_registrations(1)
            kubelet.wait_update(lambda d: len(d) == GPUS * SPLIT)
            allocate = bench_allocate(kubelet, api, args.pods)
            base = baseline(kubelet, api.url, root / "kubelet")
            faults = bench_faults(kubelet, agent, args.faults)
        finally:
            agent.stop()
            pods.stop(wait=False)
            kubelet.stop()
            client.close()
    own = allocate_in_own_process(args.pods)
    report(own, allocate, base, faults)
    with_api, guessing = race(args.race_runs, True), race(args.race_runs, False)
    print(f"two pods bound at once, {args.race_runs} randomized runs: both pods got their "
          f"decided GPUs in {with_api} with the PodResources handshake, {guessing} with "
          f"oldest-pod guessing (ratio {with_api / max(guessing, 1):.2f})")
    return 0


def report(own: list[float], allocate: list[float], base: dict[str, float],
           faults: dict[str, list[float]]) -> None:
    print(f"node: {GPUS} GPUs x {SPLIT} logical devices, ~{ON_NODE} pods on the node")
    for what, values in (("agent in its own process", own), ("all in one process", allocate)):
        tail = p99(values)
        print(f"Allocate, {what}, over {len(values)} pods: p50 {ms(statistics.median(values))}, "
              f"p99 {ms(tail)}, max {ms(max(values))}  "
              f"(target p99 <= 10 ms: {'met' if tail <= 0.010 else 'MISSED'})")
    med = statistics.median(allocate)
    io = sum(base.values())
    for name, value in base.items():
        print(f"  baseline {name}: p50 {ms(value)}")
    print(f"  Allocate p50 (one process) / (list + PodResources + empty call) = {med / io:.2f}")
    for name, values in faults.items():
        print(f"{name} -> ListAndWatch over {len(values)}: p50 {ms(statistics.median(values))}, "
              f"max {ms(max(values))}  (target <= 1 s: "
              f"{'met' if max(values) <= 1.0 else 'MISSED'})")


if __name__ == "__main__":
    sys.exit(main())
