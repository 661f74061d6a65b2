"""Benchmark of the scheduler extender: per-pod latency, throughput, memory, rebuild time.

    .venv/bin/python bench/bench_extender.py [--nodes 1000 5000] [--pods 300] [--quick]

The fake API server runs in a child process (so neither its CPU nor its memory is
counted against the extender). For each cluster size (N nodes × 8 GPUs of 80 GiB,
30 % of GPUs already in use by annotated pods) it schedules ``--pods`` pods the way
kube-scheduler does — filter (node-cache capable: all node names), prioritize (the
passing nodes), bind (the best) — and prints:

* p50 / p99 of filter + prioritize + bind per pod, in-process (the app's handlers,
  JSON in and out) and over HTTP on loopback (uvicorn + httpx), for the default
  policy and the best-fit baseline measured in the same run, with ratios; every
  node name is sent (``percentageOfNodesToScore: 100``, the worst case), plus one
  run sending the share kube-scheduler sends by default (50 − N/125 %);
* sustained pods/s: one pod after another (pods/s), and with binds in flight
  while the next pods are filtered, as kube-scheduler's asynchronous binding
  cycle does (piped/s);
* the rebuild: a fresh process lists 5,000 nodes / 40,000 GPUDevices / 50,000 pods
  (``--rebuild-pods``) from the fake API and re-creates every allocation from
  annotations; its time and the process's resident memory.

Targets (issue 3): p99 ≤ 5 ms in-process and ≤ 15 ms over HTTP, ≥ 300 pods/s,
RSS ≤ 300 MiB and rebuild ≤ 5 s at 5,000 nodes / 50,000 pods.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import msgspec

from gpupool.contract.annotations import encode
from gpupool.core.allocation import Allocation, Slice
from gpupool.core.policies import DEFAULT_POLICY
from gpupool.extender import protocol
from gpupool.extender.app import build_app
from gpupool.extender.cache import ClusterCache
from gpupool.extender.feeds import start_feeds
from gpupool.extender.metrics import Metrics
from gpupool.extender.server import ThreadedServer
from gpupool.extender.service import Extender, Settings
from gpupool.kube.api import KubeApi

GPUS = 8
GPU_MIB = 81920
BASELINE = "best-fit"
SHAPES = [  # (gpu-memory MiB, gpu-core %, gpu count) of the pods scheduled
    ({"gpupool.io/gpu-memory": "10240", "gpupool.io/gpu-core": "20"}),
    ({"gpupool.io/gpu-memory": "20480", "gpupool.io/gpu-core": "40"}),
    ({"gpupool.io/gpu-memory": "40960", "gpupool.io/gpu-core": "50"}),
    ({"gpupool.io/gpu": "1"}),
    ({"gpupool.io/gpu": "2"}),
]


# -- the cluster ---------------------------------------------------------------------------
def node_obj(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"allocatable": {"cpu": "128", "memory": "1Ti", "pods": "250"}}}


def gpu_obj(node: str, j: int, stamp: str) -> dict[str, Any]:
    uuid = f"GPU-{node}-{j}"
    return {"metadata": {"name": uuid.lower(), "labels": {"gpupool.io/node": node}},
            "spec": {"node": node, "uuid": uuid, "index": j, "model": "H100-80GB",
                     "memoryMiB": GPU_MIB, "numaNode": j * 2 // GPUS},
            "status": {"health": "Healthy", "heartbeatTime": stamp}}


def pod_obj(name: str, limits: dict[str, str], uid: str | None = None, node: str = "",
            notes: dict[str, str] | None = None) -> dict[str, Any]:
    res = {"requests": {"cpu": "2", "memory": "8Gi", **limits}, "limits": dict(limits)}
    meta: dict[str, Any] = {"name": name, "namespace": "bench", "annotations": notes or {}}
    if uid:
        meta["uid"] = uid
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": res}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec,
            "status": {"phase": "Running" if node else "Pending"}}


def cluster_lines(nodes: int, busy_pods: int, cpu_pods: int, seed: int) -> Iterator[str]:
    """JSON lines for the fake API: nodes, GPUDevices, bound pods with decisions."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    rng = random.Random(seed)
    for i in range(nodes):
        yield json.dumps({"kind": "nodes", "object": node_obj(f"n{i:05d}")})
        for j in range(GPUS):
            yield json.dumps({"kind": "gpudevices", "object": gpu_obj(f"n{i:05d}", j, stamp)})
    free = {(i, j): 100 for i in range(nodes) for j in range(GPUS)}
    slots = list(free)
    for k in range(busy_pods):  # shared slices of 10-40 % on random GPUs with room
        i, j = rng.choice(slots)
        core = rng.choice((10, 20, 30, 40))
        if free[i, j] < core:
            continue
        free[i, j] -= core
        node, uid = f"n{i:05d}", f"busy-{k}"
        alloc = Allocation(uid, node, 2000, 8192, (Slice(f"GPU-{node}-{j}", j,
                                                         core * GPU_MIB // 100, core, "main"),))
        limits = {"gpupool.io/gpu-memory": str(core * GPU_MIB // 100),
                  "gpupool.io/gpu-core": str(core)}
        yield json.dumps({"kind": "pods", "object": pod_obj(
            f"busy-{k}", limits, uid, node, encode(alloc, "2026-01-01T00:00:00Z"))})
    for k in range(cpu_pods):
        yield json.dumps({"kind": "pods", "object": pod_obj(
            f"cpu-{k}", {}, f"cpu-{k}", f"n{rng.randrange(nodes):05d}")})


class FakeApi:
    """The fake API server in a child process, loaded from a seed file."""

    def __init__(self, lines: Iterator[str]):
        self.dir = tempfile.TemporaryDirectory()
        seed = Path(self.dir.name) / "seed.jsonl"
        seed.write_text("\n".join(lines))
        self.proc = subprocess.Popen([sys.executable, "-m", "gpupool.kube.fake_apiserver",
                                      str(seed)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout is not None
        self.url, count = self.proc.stdout.readline().split()
        self.objects = int(count)
        self.http = httpx.Client(base_url=self.url, trust_env=False)  # one TLS setup, not
        # one per pod (creating the pods is not timed, but took 16 ms each)

    def create_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        r = self.http.post("/api/v1/namespaces/bench/pods", json=pod)
        r.raise_for_status()
        result: dict[str, Any] = r.json()
        return result

    def close(self) -> None:
        self.http.close()
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        self.dir.cleanup()


# -- measuring -------------------------------------------------------------------------------
def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


Call = Callable[[str, bytes], bytes]


def in_process(ext: Extender) -> Call:
    """The app's work without the socket: decode the body, decide, encode the answer."""
    handlers = {"filter": ext.filter, "prioritize": ext.prioritize, "bind": ext.bind}

    def call(verb: str, body: bytes) -> bytes:
        return protocol.encode(handlers[verb](protocol.decode(body, verb)))
    return call


class ApiClock:
    """Time spent waiting on the API server (the ledger write and the Binding), per pod."""

    CALLS = ("bind_pod", "create_ledger", "patch_ledger", "get_ledger", "get_pod_json")

    def __init__(self, kube: KubeApi):
        self.spent = 0.0
        for name in self.CALLS:
            setattr(kube, name, self._timed(getattr(kube, name)))

    def _timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent += time.perf_counter() - t0
        return wrapper


def over_http(client: httpx.Client) -> Call:
    headers = {"Content-Type": "application/json"}

    def call(verb: str, body: bytes) -> bytes:
        return client.post("/" + verb, content=body, headers=headers).content
    return call


def schedule_one(call: Call, pod: dict[str, Any], names_json: bytes) -> tuple[bool, float]:
    """filter -> prioritize -> bind as kube-scheduler does; (bound, seconds spent in the
    extender's calls). Building request bodies and picking the best host are the
    scheduler's work and are not counted."""
    pod_json = json.dumps(pod).encode()
    spent = 0.0

    def timed(verb: str, body: bytes) -> Any:
        nonlocal spent
        t0 = time.perf_counter()
        answer = call(verb, body)
        spent += time.perf_counter() - t0
        return msgspec.json.decode(answer)  # the scheduler's work: not counted

    passing = timed("filter", b'{"Pod":' + pod_json + b',"Nodes":null,"NodeNames":' +
                    names_json + b"}")["NodeNames"]
    if not passing:
        return False, spent
    best = passing[0]
    if len(passing) > 1:
        body = b'{"Pod":' + pod_json + b',"Nodes":null,"NodeNames":' + \
            json.dumps(passing).encode() + b"}"
        scores = timed("prioritize", body)
        if scores:
            best = max(scores, key=lambda h: h["Score"])["Host"]
    meta = pod["metadata"]
    bind = json.dumps({"PodName": meta["name"], "PodNamespace": "bench",
                       "PodUID": meta["uid"], "Node": best}).encode()
    return timed("bind", bind)["Error"] == "", spent


def run_pods(call: Call, api: FakeApi, names: list[str], count: int, tag: str,
             rng: random.Random, clock: ApiClock, window: int = 0) -> dict[str, float]:
    """``window`` > 0: send that many nodes per pod, starting where the last pod's window
    ended (kube-scheduler's percentageOfNodesToScore with its rotating start)."""
    pods = [api.create_pod(pod_obj(f"{tag}-{k}", rng.choice(SHAPES))) for k in range(count)]
    times, own, bound = [], [], 0
    sent = [names] if not window else [
        (names * 2)[k * window % len(names):][:window] for k in range(count)]
    bodies = [json.dumps(s).encode() for s in sent]
    start = time.perf_counter()
    for k, pod in enumerate(pods):
        api0 = clock.spent
        ok, spent = schedule_one(call, pod, bodies[k % len(bodies)])
        bound += ok
        times.append(spent)
        own.append(spent - (clock.spent - api0))
    wall = time.perf_counter() - start
    return {"p50_ms": pct(times, 0.5) * 1e3, "p99_ms": pct(times, 0.99) * 1e3,
            "own_p50_ms": pct(own, 0.5) * 1e3, "own_p99_ms": pct(own, 0.99) * 1e3,
            "pods_per_s": count / wall, "bound": bound}


def run_pipelined(call: Call, api: FakeApi, names: list[str], count: int, tag: str,
                  rng: random.Random) -> dict[str, float]:
    """Sustained pods/s with binds in flight while the next pods are filtered, as
    kube-scheduler runs its binding cycle asynchronously (8 binds at most in flight).
    A bind refused because an earlier bind took the room is retried from filter."""
    pods = [api.create_pod(pod_obj(f"{tag}-{k}", rng.choice(SHAPES))) for k in range(count)]
    names_json = json.dumps(names).encode()
    queue, retries, bound = list(reversed(pods)), 0, 0
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=8) as pool:
        inflight: list[tuple[dict[str, Any], Future[Any]]] = []
        while queue or inflight:
            if queue:
                pod = queue.pop()
                node = choose_node(call, pod, names_json)
                if node is not None:
                    inflight.append((pod, pool.submit(bind_to, call, pod, node)))
            if inflight and (not queue or len(inflight) >= 8 or inflight[0][1].done()):
                pod, future = inflight.pop(0)
                if future.result():
                    bound += 1
                else:
                    retries += 1
                    if retries < count:
                        queue.append(pod)
    wall = time.perf_counter() - start
    return {"pods_per_s": bound / wall, "bound": bound, "retries": retries}


def choose_node(call: Call, pod: dict[str, Any], names_json: bytes) -> str | None:
    pod_json = json.dumps(pod).encode()
    answer = msgspec.json.decode(call("filter", b'{"Pod":' + pod_json + b',"NodeNames":' +
                                      names_json + b"}"))
    passing = answer["NodeNames"]
    if not passing:
        return None
    if len(passing) == 1:
        return str(passing[0])
    scores = msgspec.json.decode(call("prioritize", b'{"Pod":' + pod_json + b',"NodeNames":'
                                      + json.dumps(passing).encode() + b"}"))
    return str(max(scores, key=lambda h: h["Score"])["Host"]) if scores else str(passing[0])


def bind_to(call: Call, pod: dict[str, Any], node: str) -> bool:
    meta = pod["metadata"]
    body = json.dumps({"PodName": meta["name"], "PodNamespace": "bench",
                       "PodUID": meta["uid"], "Node": node}).encode()
    return bool(msgspec.json.decode(call("bind", body))["Error"] == "")


def adaptive_percentage(nodes: int) -> int:
    """kube-scheduler's default percentageOfNodesToScore: 50 − nodes/125, at least 5."""
    return max(5, 50 - nodes // 125)


def warm_up(ext: Extender, api: FakeApi, names: list[str], policy: str) -> None:
    """Three pods of every shape: the first pod of a shape fills the policy's and the
    reasons' per-node caches (a one-off cost per shape and layout, reported apart)."""
    clock = ApiClock.__new__(ApiClock)
    clock.spent = 0.0
    names_json = json.dumps(names).encode()
    for k, shape in enumerate(SHAPES * 3):
        pod = api.create_pod(pod_obj(f"warm-{policy}-{k}", shape))
        t0 = time.perf_counter()
        schedule_one(in_process(ext), pod, names_json)
        if k < len(SHAPES):
            print(f"  first pod of shape {shape}: {(time.perf_counter() - t0) * 1e3:.1f} ms "
                  "(cold caches, incl. API)")


def measure(nodes: int, pods: int, seed: int) -> list[tuple[str, dict[str, float]]]:
    busy = int(nodes * GPUS * 0.3 / 0.25)  # about 30 % of the GPU share in use
    api = FakeApi(cluster_lines(nodes, busy, 0, seed))
    rows = []
    try:
        for policy in (DEFAULT_POLICY, BASELINE):
            kube = KubeApi.connect(server=api.url)
            cache = ClusterCache()
            feeds = start_feeds(kube, cache, watch_timeout_s=30)
            ext = Extender(cache, Settings(policy, seed=seed), Metrics(), kube)
            clock = ApiClock(kube)
            ext.refresh_policy()
            gc.freeze()  # as `gpupool extender` does after the rebuild
            names = sorted(cache.state.index)
            rng = random.Random(seed)
            warm_up(ext, api, names, policy)
            rows.append((f"{policy} in-process", run_pods(
                in_process(ext), api, names, pods, f"ip-{policy}", rng, clock)))
            rows[-1][1].update(pipelined=run_pipelined(
                in_process(ext), api, names, pods, f"pl-{policy}", rng)["pods_per_s"])
            if policy == DEFAULT_POLICY and nodes >= 1000:
                window = max(100, nodes * adaptive_percentage(nodes) // 100)
                rows.append((f"{policy} in-process, {window} sent", run_pods(
                    in_process(ext), api, names, pods, f"win-{policy}", rng, clock, window)))
            with ThreadedServer(build_app(ext)) as server, \
                    httpx.Client(base_url=server.url, trust_env=False) as http:
                rows.append((f"{policy} HTTP loopback", run_pods(
                    over_http(http), api, names, pods, f"http-{policy}", rng, clock)))
            feeds.stop(timeout_s=0.0)
            kube.close()
    finally:
        api.close()
    return rows


def peak_rss_mib() -> float:
    """Peak resident memory of this process (VmHWM; getrusage would carry the parent's
    peak across exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _timed_into(total: list[float], fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            total[0] += time.perf_counter() - t0
    return wrapper


def rebuild_child(url: str) -> None:
    """In a fresh process: list everything, rebuild, report time and memory as JSON."""
    start = time.perf_counter()
    kube = KubeApi.connect(server=url, timeout_s=120)
    cache = ClusterCache()
    handlers = [0.0]
    for name in ("sync_nodes", "sync_devices", "sync_classes", "sync_groups", "sync_ledgers",
                 "sync_pods"):
        setattr(cache, name, _timed_into(handlers, getattr(cache, name)))
    feeds = start_feeds(kube, cache, watch_timeout_s=60, sync_timeout_s=300)
    took = time.perf_counter() - start
    rss_mib = peak_rss_mib()
    print(json.dumps({"seconds": took, "rss_mib": rss_mib, "cache_seconds": handlers[0],
                      "nodes": len(cache.state.nodes),
                      "pods": len(cache.pods), "allocations": len(cache.state.allocations),
                      "gpu_allocations": sum(1 for a in cache.state.allocations.values()
                                             if a.slices)}))
    feeds.stop(timeout_s=0.0)


def measure_rebuild(nodes: int, pods: int, seed: int) -> dict[str, float]:
    gpu_pods = pods * 3 // 5
    api = FakeApi(cluster_lines(nodes, gpu_pods, pods - gpu_pods, seed))
    try:
        out = subprocess.run([sys.executable, __file__, "--rebuild-child", api.url],
                             capture_output=True, text=True, timeout=600, check=True)
        result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
        return result
    finally:
        api.close()


# -- report -----------------------------------------------------------------------------------
def report(nodes: int, rows: list[tuple[str, dict[str, float]]]) -> None:
    print(f"\n{nodes} nodes × {GPUS} GPUs — per pod: filter + prioritize + bind "
          "(own = without the waits on the API server)")
    print(f"{'run':34} {'p50 ms':>7} {'p99 ms':>7} {'own p50':>8} {'own p99':>8} "
          f"{'pods/s':>7} {'piped/s':>8} {'bound':>6}")
    for name, r in rows:
        piped = f"{r['pipelined']:8.0f}" if "pipelined" in r else f"{'-':>8}"
        print(f"{name:34} {r['p50_ms']:7.2f} {r['p99_ms']:7.2f} {r['own_p50_ms']:8.2f} "
              f"{r['own_p99_ms']:8.2f} {r['pods_per_s']:7.0f} {piped} {r['bound']:6.0f}")
    by = dict(rows)
    d_ip, d_http = by[f"{DEFAULT_POLICY} in-process"], by[f"{DEFAULT_POLICY} HTTP loopback"]
    b_ip = by[f"{BASELINE} in-process"]
    print(f"ratio p99 {DEFAULT_POLICY} / {BASELINE} (in-process): "
          f"{d_ip['p99_ms'] / b_ip['p99_ms']:.2f}")
    print(f"ratio p99 HTTP / in-process ({DEFAULT_POLICY}): "
          f"{d_http['p99_ms'] / d_ip['p99_ms']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--pods", type=int, default=300)
    parser.add_argument("--rebuild-nodes", type=int, default=5000)
    parser.add_argument("--rebuild-pods", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--rebuild-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rebuild_child:
        rebuild_child(args.rebuild_child)
        return
    if args.quick:
        args.nodes, args.pods, args.rebuild_nodes, args.rebuild_pods = [200], 50, 500, 5000
    for n in args.nodes:  # --nodes 0: only the rebuild
        if n > 0:
            report(n, measure(n, args.pods, args.seed))
    r = measure_rebuild(args.rebuild_nodes, args.rebuild_pods, args.seed)
    print(f"\nrebuild from the API: {r['nodes']:.0f} nodes, {r['pods']:.0f} pods "
          f"({r['gpu_allocations']:.0f} with GPU decisions) in {r['seconds']:.2f} s "
          f"(of which the cache's own work {r['cache_seconds']:.2f} s; the rest is listing "
          f"from the fake API server and decoding); peak RSS {r['rss_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
