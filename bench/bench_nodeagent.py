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
  both for in-process injection and for an edit of the fake GPU file (polled);
* decision verification: every decision is signed (Ed25519) and the agent
  verifies it with the keys it reads from the FAKE API server's ConfigMap, as
  deployed. Allocate in its own process is measured with verification and,
  as the baseline of the same run, with ``--decide-unscheduled`` (no
  verification); the cost of one signature check, of a remembered check, and of
  decoding the same decision (the baseline) are timed directly;
* one usage-monitor sample at 8 GPUs × 100 processes (80 pods of 10 processes,
  each process's cgroup file in a temporary /proc tree): wall and CPU time, and
  as the baseline of the same run the cost of reading the 800 cgroup files alone.

Targets: Allocate p99 ≤ 10 ms with verification; fault and recovery ≤ 1 s.

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
from nodeagent.builders import (  # noqa: E402
    KEYS,
    NAMESPACE,
    NODE,
    decision,
    pod,
    uuid_of,
    write_gpus,
)
from nodeagent.kubelet_standin import FakeKubelet, runtime_gpus  # noqa: E402
from nodeagent.test_race import random_pod  # noqa: E402

from gpupool.kube.api import KubeApi  # noqa: E402
from gpupool.kube.keystore import KeyRingSource, publish  # noqa: E402
from gpupool.nodeagent.agent import AgentConfig, Guards, NodeAgent  # noqa: E402
from gpupool.nodeagent.fakegpus import FakeGpuBackend  # noqa: E402
from gpupool.nodeagent.kubeview import KubePods  # noqa: E402
from gpupool.nodeagent.logical import Split  # noqa: E402
from gpupool.nodeagent.podresources import PodResourcesClient  # noqa: E402
from gpupool.nodeagent.proto import deviceplugin_pb2 as dp  # noqa: E402

from machine import line as machine_line  # noqa: E402

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
            got = kubelet.admit(p, rng)
            ok &= all(runtime_gpus(got, c) == sorted(u) for c, u in want.items())
        except Exception:  # a refusal or a failed start counts as a wrong run
            ok = False
    for p, _ in order:
        kubelet.forget(f"default/{p['metadata']['name']}")
        api.delete("pods", p["metadata"]["name"], "default")
    return ok


def allocate_in_own_process(pods: int, verify: bool = True) -> list[float]:
    """Allocate latencies with the agent run as ``gpupool device-plugin`` in a subprocess
    (``verify`` False: ``--decide-unscheduled``, which verifies nothing)."""
    root = Path(tempfile.mkdtemp(prefix="gps-", dir="/tmp"))
    with FakeApiServer() as api:
        kubelet = FakeKubelet(root / "kubelet").start()
        gpus = write_gpus(root / "gpus.yaml", GPUS, 81920)
        client = KubeApi.connect(server=api.url)
        publish(client, NAMESPACE, KEYS)
        client.close()
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpupool.cli.main", "device-plugin", "--node-name", NODE,
             "--api-server", api.url, "--kubelet-dir", str(kubelet.root), "--fake-gpus",
             str(gpus), "--split", str(SPLIT), "--log-level", "ERROR", "--namespace",
             NAMESPACE, "--isolation-provider", "none", "--metrics-port", "0",
             *([] if verify else ["--decide-unscheduled"])])
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
    parser.add_argument("--rounds", type=int, default=3,
                        help="own-process Allocate runs with and without verification, "
                             "alternated (the machine's speed drifts between runs)")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # refusals and fallbacks are expected here; figures only
    print(machine_line("before"))
    root = Path(tempfile.mkdtemp(prefix="gpb-", dir="/tmp"))
    with FakeApiServer() as api:
        kubelet = FakeKubelet(root / "kubelet").start()
        client = KubeApi.connect(server=api.url)
        publish(client, NAMESPACE, KEYS)
        config = AgentConfig(NODE, root / "kubelet", Split(SPLIT), watch_s=0.05)
        pods = KubePods(client)
        keys = KeyRingSource(client, NAMESPACE, time.time)
        agent = NodeAgent(config, FakeGpuBackend(write_gpus(root / "gpus.yaml", GPUS, 81920)),
                          pods, guards=Guards(verifier=keys.verify))
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
    own, unverified = alternate(args.pods, args.rounds)
    report(own, allocate, base, faults)
    tail = p99(unverified)
    print(f"Allocate, own process, WITHOUT verification (baseline, --decide-unscheduled), "
          f"{len(unverified)} pods: p50 {ms(statistics.median(unverified))}, p99 {ms(tail)}; "
          f"with / without: p50 {statistics.median(own) / statistics.median(unverified):.2f}, "
          f"p99 {p99(own) / tail:.2f}")
    verification_cost()
    monitor_sample()
    with_api, guessing = race(args.race_runs, True), race(args.race_runs, False)
    print(f"two pods bound at once, {args.race_runs} randomized runs: both pods got their "
          f"decided GPUs in {with_api} with the PodResources handshake, {guessing} with "
          f"oldest-pod guessing (ratio {with_api / max(guessing, 1):.2f})")
    print(machine_line("after"))
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


def alternate(pods: int, rounds: int) -> tuple[list[float], list[float]]:
    """Own-process Allocate latencies with and without verification, runs alternated."""
    verified: list[float] = []
    unverified: list[float] = []
    for r in range(rounds):
        for verify, into in ((True, verified), (False, unverified)):
            got = allocate_in_own_process(pods, verify)
            print(f"  round {r + 1}, {'with' if verify else 'without'} verification: p50 "
                  f"{ms(statistics.median(got))}, p99 {ms(p99(got))}", flush=True)
            into.extend(got)
    return verified, unverified


def verification_cost(n: int = 2000) -> None:
    """One Ed25519 check of a decision, a remembered check, and decoding it (baseline)."""
    from gpupool.contract import annotations
    from gpupool.kube.verifier import DecisionVerifier
    from gpupool.nodeagent.pods import pod_from_json
    from gpupool.nodeagent.verify import DecisionGate
    from gpupool.security.signing import claims_of

    ring = KEYS.public()
    pods = [pod_from_json(pod(f"v{i}", [("main", 1, 1024, 10)], ann=decision(
        f"v{i}", [(uuid_of(i % GPUS), i % GPUS, 1024, 10, "main")]))) for i in range(n)]
    claims = [(claims_of(p.uid, p.namespace, p.name, p.annotations), p.signature)
              for p in pods]
    start = time.perf_counter()
    for c, sig in claims:
        ring.verify(c, sig)
    check = (time.perf_counter() - start) / n
    gate = DecisionGate(NODE, DecisionVerifier(lambda wanted: ring).verify)
    for p in pods:
        gate.check(p)
    start = time.perf_counter()
    for p in pods:
        gate.check(p)
    remembered = (time.perf_counter() - start) / n
    start = time.perf_counter()
    for p in pods:
        annotations.decode(p.uid, p.annotations)
    decode = (time.perf_counter() - start) / n
    print(f"decision verification over {n} decisions: Ed25519 check {check * 1e6:.0f} us, "
          f"remembered (the Allocate path after the first) {remembered * 1e6:.1f} us; "
          f"decoding the decision (baseline) {decode * 1e6:.0f} us; check / decode = "
          f"{check / decode:.1f}")


def monitor_sample(per_gpu: int = 100, rounds: int = 20) -> None:
    """One usage sample at GPUS x ``per_gpu`` processes; wall and CPU time."""
    from nodeagent.builders import cgroup_v2, container_id, pod_uid, running, write_cgroup

    from gpupool.kube.verifier import DecisionVerifier
    from gpupool.nodeagent.monitor import MonitorConfig, UsageMonitor
    from gpupool.nodeagent.nodestate import holds_gpus
    from gpupool.nodeagent.overuse import OveruseConfig, OveruseTracker
    from gpupool.nodeagent.pods import pod_from_json
    from gpupool.nodeagent.verify import DecisionGate

    root = Path(tempfile.mkdtemp(prefix="gpm-", dir="/tmp"))
    backend = FakeGpuBackend(write_gpus(root / "gpus.yaml", GPUS, 81920))
    pods, pid = [], 1000
    for g in range(GPUS):
        procs = []
        for k in range(per_gpu // 10):
            n = g * 100 + k
            name, uid, cid = f"m{n}", pod_uid(n), container_id(n)
            ann = decision(name, [(uuid_of(g), g, 4096, 10, "main")], uid=uid)
            ann["gpupool.io/phase"] = "allocated"
            pods.append(pod_from_json(running(pod(name, [("main", 1, 4096, 10)], uid=uid,
                                                  ann=ann), {"main": cid})))
            for _ in range(10):
                pid += 1
                write_cgroup(root / "proc", pid, cgroup_v2(uid, cid))
                procs.append((pid, 300, 1))
        backend.set_processes(uuid_of(g), procs)
    assert all(holds_gpus(p) for p in pods)
    ring = KEYS.public()
    gate = DecisionGate(NODE, DecisionVerifier(lambda wanted: ring).verify)
    monitor = UsageMonitor(MonitorConfig(NODE, root / "proc"), backend.usage, lambda: pods,
                           gate, OveruseTracker(OveruseConfig()), lambda c, p: None)
    walls, cpus = [], []
    for _ in range(rounds):
        wall, cpu = time.perf_counter(), time.process_time()
        changes = monitor.sample_once()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    assert not changes.current and len(monitor.last) == len(pods)
    files = [root / "proc" / str(p) / "cgroup" for p in range(1001, pid + 1)]
    io = statistics.median(timed(lambda: [f.read_text() for f in files], rounds))
    print(f"usage-monitor sample, {GPUS} GPUs x {per_gpu} processes ({len(pods)} pods), "
          f"{rounds} samples: wall p50 {ms(statistics.median(walls))} (first {ms(walls[0])}), "
          f"CPU p50 {ms(statistics.median(cpus))}; baseline reading the {len(files)} cgroup "
          f"files alone {ms(io)}; sample / read = {statistics.median(walls) / io:.2f}")
    backend.close()


if __name__ == "__main__":
    sys.exit(main())
