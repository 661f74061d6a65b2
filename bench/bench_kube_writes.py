"""Benchmark of the Kubernetes API calls a bind makes, and of what a bound pod costs the
extender's watch threads.

    .venv/bin/python bench/bench_kube_writes.py [--writes 2000] [--pods 400] [--nodes 500]
                                                [--part writes|watch|all]

The fake API server runs in a child process (``python -m gpupool_testing.fake_apiserver``)
so its CPU is not counted against the client.

* **writes**: ``--writes`` Bindings (with the four decision annotations a bind sends)
  and ``--writes`` GPULedger merge patches carrying a resourceVersion precondition (each
  adds an entry and drops an older one, so a ledger keeps about 8 entries), through
  ``KubeApi`` (lightkube), and, as the baseline, the same requests as bare httpx calls
  on the same transport (``ApiTransport``): what lightkube adds on top of its own HTTP
  client; and ``KubeApi`` with the bind path's writes built by lightkube, as before
  ``gpupool.kube.wire`` (the label ``KubeApi, lightkube``). In alternating rounds of 50
  in the same run; p50 / p99 per write, the writing thread's CPU, and the ratios KubeApi
  / bare httpx and KubeApi / KubeApi through lightkube.
* **watch**: an extender (cache, informers, ``Extender``) on ``--nodes`` nodes × 8 GPUs
  binds ``--pods`` pods in-process (filter → prioritize → bind). Every bind makes the API
  server send two watch events (the pod MODIFIED, the GPULedger MODIFIED); the CPU time
  of the pod and GPULedger watch threads (per-thread CPU clocks) while binding, divided
  by the pods bound.
* **quota**: the same extender with a TenantQuota covering namespace ``bench`` (a limit no
  pod reaches, so every bind of its pods is admitted after a QuotaLedger compare-and-swap)
  binds ``--pods`` pods alternately of ``bench`` and of ``free`` (no quota: no QuotaLedger
  touched, the baseline in the same run); p50 / p99 wall time of the bind call, per kind.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx2
import msgspec
from bench_extender import FakeApi  # the script's folder is on sys.path
from lightkube.config.kubeconfig import KubeConfig
from lightkube.config.models import Cluster, User

from gpupool.contract.annotations import encode
from gpupool.contract.names import ANNOTATION_SIGNATURE
from gpupool.core.allocation import Allocation, Slice
from gpupool.core.policies import DEFAULT_POLICY
from gpupool.extender.metrics import Metrics
from gpupool.extender.service import Extender, Settings
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.state.feeds import start_feeds
from gpupool.extender.state.signatures import DecisionCheck, DecisionKeys
from gpupool.extender.wire import protocol
from gpupool.kube.api import FIELD_MANAGER, KubeApi
from gpupool.kube.connection import ApiTransport
from gpupool.security.signing import SigningKeys, claims_of

from machine import line as machine_line

GPUS = 8
KEYS = SigningKeys().added(0.0)  # the decision keys of the benchmark's extender
GPU_MIB = 81920
ROUND = 50  # writes per path before switching to the next
LIGHTKUBE = "KubeApi, lightkube"
PATHS = ("bare httpx", LIGHTKUBE, "KubeApi")
WATCHED = ("informer-pods", "informer-gpuledgers")
SHAPES = [{"gpupool.io/gpu-memory": "10240", "gpupool.io/gpu-core": "20"},
          {"gpupool.io/gpu-memory": "20480", "gpupool.io/gpu-core": "40"},
          {"gpupool.io/gpu": "1"}]


# -- the fake API server in a child process (bench_extender's, fed JSON lines) -------------
def fake_api(lines: Iterator[dict[str, Any]]) -> FakeApi:
    return FakeApi(json.dumps(line) for line in lines)


def pod_obj(name: str, limits: dict[str, str], uid: str = "", node: str = "",
            notes: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "bench", "annotations": notes or {}}
    if uid:
        meta["uid"] = uid
    res = {"requests": {"cpu": "2", "memory": "8Gi", **limits}, "limits": dict(limits)}
    spec: dict[str, Any] = {"schedulerName": "gpupool-scheduler",
                            "containers": [{"name": "main", "resources": res}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": {"phase": "Running" if node else "Pending"}}


def alloc_notes(uid: str, node: str, j: int, core: int) -> dict[str, str]:
    """The signed decision of pod ``uid`` (named as its uid, in namespace bench)."""
    alloc = Allocation(uid, node, 2000, 8192, (Slice(f"GPU-{node}-{j}", j,
                                                     core * GPU_MIB // 100, core, "main"),))
    notes = encode(alloc, "2026-01-01T00:00:00.000000Z")
    notes[ANNOTATION_SIGNATURE] = KEYS.active(0).sign(claims_of(uid, "bench", uid, notes))
    return notes


# -- writes -----------------------------------------------------------------------------------
def write_seed(pods: int, ledgers: int) -> Iterator[dict[str, Any]]:
    for k in range(pods):
        yield {"kind": "pods", "object": pod_obj(f"w-{k}", {}, f"w-{k}")}
    for k in range(ledgers):
        yield {"kind": "gpuledgers", "object": {"metadata": {"name": f"l-{k}"},
                                                "spec": {"node": f"l-{k}", "entries": {}}}}


class BareHttpx:
    """The writes a bind makes as bare httpx requests on ``KubeApi``'s own transport (the
    baseline: the same bytes on the wire, no lightkube)."""

    LEDGERS = "/apis/gpupool.io/v1alpha1/gpuledgers"

    def __init__(self, url: str):
        config = KubeConfig.from_one(cluster=Cluster(server=url), user=User()).get()
        self.http = httpx2.Client(base_url=url, timeout=10.0,
                                  transport=ApiTransport.for_config(config, 10.0, False))

    def bind_pod(self, namespace: str, name: str, uid: str, node: str,
                 annotations: dict[str, str]) -> None:
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {
            "name": name, "namespace": namespace, "uid": uid, "annotations": annotations},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        self._send("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", body)

    def get_ledger(self, node: str) -> dict[str, Any]:
        return self._send("GET", f"{self.LEDGERS}/{node}")

    def patch_ledger(self, node: str, patch: dict[str, Any], version: str) -> dict[str, Any]:
        body = {**patch, "metadata": {"resourceVersion": version}}
        return self._send("PATCH", f"{self.LEDGERS}/{node}", body,
                          "application/merge-patch+json")

    def _send(self, method: str, path: str, body: Any = None,
              kind: str = "application/json") -> dict[str, Any]:
        content = None if body is None else msgspec.json.encode(body)
        r = self.http.request(method, path, content=content, headers={"Content-Type": kind},
                              params={"fieldManager": FIELD_MANAGER} if body else None)
        r.raise_for_status()
        result: dict[str, Any] = msgspec.json.decode(r.content)
        return result

    def close(self) -> None:
        self.http.close()


class Writer:
    """One path's writes: Bindings of its own pods, patches of its own ledgers."""

    def __init__(self, api: KubeApi | BareHttpx, pods: list[str], ledgers: list[str]):
        self.api, self.pods, self.ledgers = api, iter(pods), ledgers
        self.versions = {name: "" for name in ledgers}
        self.count = 0
        self.binds: list[float] = []
        self.patches: list[float] = []
        self.cpu: dict[str, list[float]] = {"binds": [], "patches": []}  # this thread's CPU

    def bind(self) -> None:
        name = next(self.pods)
        notes = alloc_notes(name, "n1", 3, 20)
        c0, t0 = time.thread_time(), time.perf_counter()
        self.api.bind_pod("bench", name, name, "n1", notes)
        self.binds.append(time.perf_counter() - t0)
        self.cpu["binds"].append(time.thread_time() - c0)

    def patch(self) -> None:
        self.count += 1
        node = self.ledgers[self.count % len(self.ledgers)]
        if not self.versions[node]:
            self.versions[node] = self.api.get_ledger(node)["metadata"]["resourceVersion"]
        uid = f"u-{self.count}"
        entry = {"pod": f"bench/{uid}", "allocation": alloc_notes(uid, node, 3, 20)[
            "gpupool.io/allocation"], "bindTime": "2026-01-01T00:00:00.000000Z",
                 "tenant": "bench", "class": "", "group": ""}
        changes: dict[str, Any] = {uid: entry, f"u-{self.count - 8 * len(self.ledgers)}": None}
        c0, t0 = time.thread_time(), time.perf_counter()
        written = self.api.patch_ledger(node, {"spec": {"entries": changes}},
                                        self.versions[node])
        self.patches.append(time.perf_counter() - t0)
        self.cpu["patches"].append(time.thread_time() - c0)
        self.versions[node] = written["metadata"]["resourceVersion"]


def measure_writes(n: int) -> None:
    rounds = max(1, n // ROUND)
    per_path = rounds * ROUND
    ledgers = 16
    api = fake_api(write_seed(len(PATHS) * (per_path + ROUND), len(PATHS) * ledgers))
    try:
        writers = {}
        for k, label in enumerate(PATHS):
            client = BareHttpx(api.url) if k == 0 else KubeApi.connect(server=api.url)
            if label == LIGHTKUBE:  # the writes as lightkube builds them (kube.wire off)
                client._wire.url = lambda *a, **kw: None  # type: ignore[method-assign,union-attr]
            offset = k * (per_path + ROUND)
            pods = [f"w-{offset + j}" for j in range(per_path + ROUND)]
            names = [f"l-{j + k * ledgers}" for j in range(ledgers)]
            writers[label] = Writer(client, pods, names)
        for w in writers.values():  # warm-up: connections, decoders (not counted)
            for _ in range(ROUND):
                w.bind()
                w.patch()
            w.binds.clear()
            w.patches.clear()
            w.cpu = {"binds": [], "patches": []}
        for _ in range(rounds):
            for w in writers.values():
                for _ in range(ROUND):
                    w.bind()
                for _ in range(ROUND):
                    w.patch()
        for w in writers.values():
            w.api.close()
    finally:
        api.close()
    base, kube, old = writers["bare httpx"], writers["KubeApi"], writers[LIGHTKUBE]
    print(f"\nAPI writes to the fake API server (child process), {per_path} of each per path")
    print(f"{'write':42} {'p50 ms':>7} {'p99 ms':>7} {'mean ms':>8} {'client CPU p50 ms':>18}")
    for label, w in writers.items():
        for what, attr in (("Binding", "binds"), ("GPULedger patch (CAS)", "patches")):
            times = getattr(w, attr)
            print(f"{what + ', ' + label:42} {pct(times, 0.5) * 1e3:7.3f} "
                  f"{pct(times, 0.99) * 1e3:7.3f} {statistics.fmean(times) * 1e3:8.3f} "
                  f"{pct(w.cpu[attr], 0.5) * 1e3:18.3f}")
    for what, attr in (("Binding", "binds"), ("GPULedger patch", "patches")):
        b, k = getattr(base, attr), getattr(kube, attr)
        print(f"ratio KubeApi / bare httpx, {what}: p50 {pct(k, 0.5) / pct(b, 0.5):.2f}, "
              f"p99 {pct(k, 0.99) / pct(b, 0.99):.2f}, client CPU p50 "
              f"{pct(kube.cpu[attr], 0.5) / pct(base.cpu[attr], 0.5):.2f}")
        print(f"ratio KubeApi / {LIGHTKUBE}, {what}: client CPU p50 "
              f"{pct(kube.cpu[attr], 0.5) / pct(old.cpu[attr], 0.5):.2f}, p50 "
              f"{pct(getattr(kube, attr), 0.5) / pct(getattr(old, attr), 0.5):.2f}")


# -- watch side -------------------------------------------------------------------------------
def cluster_seed(nodes: int, seed: int) -> Iterator[dict[str, Any]]:
    """Nodes, GPUDevices, and annotated pods holding about 30 % of the GPU share."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    rng = random.Random(seed)
    for i in range(nodes):
        node = f"n{i:05d}"
        yield {"kind": "nodes", "object": {
            "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}},
            "status": {"allocatable": {"cpu": "128", "memory": "1Ti", "pods": "250"}}}}
        for j in range(GPUS):
            uuid = f"GPU-{node}-{j}"
            yield {"kind": "gpudevices", "object": {
                "metadata": {"name": uuid.lower(), "labels": {"gpupool.io/node": node}},
                "spec": {"node": node, "uuid": uuid, "index": j, "model": "H100-80GB",
                         "memoryMiB": GPU_MIB, "numaNode": j * 2 // GPUS},
                "status": {"health": "Healthy", "heartbeatTime": stamp}}}
    for k in range(int(nodes * GPUS * 0.3 / 0.25)):
        i, j, core = rng.randrange(nodes), rng.randrange(GPUS), rng.choice((10, 20, 30, 40))
        node, uid = f"n{i:05d}", f"busy-{k}"
        limits = {"gpupool.io/gpu-memory": str(core * GPU_MIB // 100),
                  "gpupool.io/gpu-core": str(core)}
        yield {"kind": "pods", "object": pod_obj(uid, limits, uid, node,
                                                 alloc_notes(uid, node, j, core))}


def thread_cpu() -> dict[str, float]:
    """CPU seconds of the watch threads of this process so far."""
    return {t.name: time.clock_gettime(time.pthread_getcpuclockid(t.ident))
            for t in threading.enumerate() if t.name in WATCHED and t.ident is not None}


def wait_for(done: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.02)


def call(ext: Extender, verb: str, body: dict[str, Any]) -> Any:
    """One extender call as the app makes it: JSON in, decide, JSON out."""
    handler = {"filter": ext.filter, "prioritize": ext.prioritize, "bind": ext.bind}[verb]
    return msgspec.json.decode(protocol.encode(handler(protocol.decode(
        msgspec.json.encode(body), verb))))


def schedule(ext: Extender, pod: dict[str, Any], names: list[str]) -> bool:
    """filter -> prioritize -> bind, as kube-scheduler calls them."""
    passing = call(ext, "filter", {"Pod": pod, "NodeNames": names})["NodeNames"] or []
    if not passing:
        return False
    best = passing[0]
    if len(passing) > 1:
        scores = call(ext, "prioritize", {"Pod": pod, "NodeNames": passing})
        best = max(scores, key=lambda h: h["Score"])["Host"]
    meta = pod["metadata"]
    answer = call(ext, "bind", {"PodName": meta["name"], "PodNamespace": "bench",
                                "PodUID": meta["uid"], "Node": best})
    return bool(answer["Error"] == "")


def measure_watch(nodes: int, pods: int, seed: int) -> dict[str, float]:
    api = fake_api(cluster_seed(nodes, seed))
    kube = KubeApi.connect(server=api.url)
    keys = DecisionKeys(lambda: KEYS, time.time, keys=KEYS)
    cache = ClusterCache(decisions=DecisionCheck(keys))
    feeds = start_feeds(kube, cache, watch_timeout_s=300)
    try:
        ext = Extender(cache, Settings(DEFAULT_POLICY, seed=seed), Metrics(), kube, keys)
        ext.refresh_policy()
        names = sorted(cache.state.index)
        rng = random.Random(seed)
        for k in range(10):  # warm-up: per-shape caches, connections
            schedule(ext, api.create_pod(pod_obj(
                f"warm-{k}", rng.choice(SHAPES))), names)
        todo = [api.create_pod(pod_obj(f"p-{k}", rng.choice(SHAPES)))
                for k in range(pods)]
        wait_for(lambda: all(p["metadata"]["uid"] in cache.pods for p in todo))
        time.sleep(0.5)
        before = thread_cpu()
        bound = [p for p in todo if schedule(ext, p, names)]
        wait_for(lambda: all(cache.pods[p["metadata"]["uid"]].node for p in bound))
        time.sleep(0.5)
        after = thread_cpu()
    finally:
        feeds.stop(timeout_s=0.0)
        kube.close()
        api.close()
    n = max(1, len(bound))
    return {"bound": len(bound), **{name: (after[name] - before[name]) / n * 1e6
                                    for name in WATCHED}}


def measure_quota(nodes: int, pods: int, seed: int) -> None:
    quota = {"kind": "tenantquotas", "object": {
        "metadata": {"name": "bench"},
        "spec": {"namespaces": ["bench"], "limits": {"gpus": 10**6}}}}
    api = fake_api(itertools.chain(cluster_seed(nodes, seed), [quota]))
    kube = KubeApi.connect(server=api.url)
    keys = DecisionKeys(lambda: KEYS, time.time, keys=KEYS)
    cache = ClusterCache(decisions=DecisionCheck(keys))
    feeds = start_feeds(kube, cache, watch_timeout_s=300)
    waits: dict[str, list[float]] = {"bench": [], "free": []}
    try:
        wait_for(lambda: len(cache.catalogue.tenants) == 1)
        ext = Extender(cache, Settings(DEFAULT_POLICY, seed=seed), Metrics(), kube, keys)
        ext.refresh_policy()
        names = sorted(cache.state.index)
        rng = random.Random(seed)
        todo = []
        for k in range(pods + 20):  # the first 20: warm-up
            pod = pod_obj(f"q-{k}", rng.choice(SHAPES))
            ns = pod["metadata"]["namespace"] = ("bench", "free")[k % 2]
            todo.append(api.http.post(f"/api/v1/namespaces/{ns}/pods", json=pod).json())
        wait_for(lambda: all(p["metadata"]["uid"] in cache.pods for p in todo))
        for k, pod in enumerate(todo):
            spent = timed_bind(ext, pod, names)
            if k >= 20 and spent is not None:
                waits[pod["metadata"]["namespace"]].append(spent)
    finally:
        feeds.stop(timeout_s=0.0)
        kube.close()
        api.close()
    q, f = waits["bench"], waits["free"]
    print(f"\nbind wall time, ms (p50 / p99): under a TenantQuota {pct(q, 0.5) * 1e3:.2f} / "
          f"{pct(q, 0.99) * 1e3:.2f} ({len(q)} binds); no quota {pct(f, 0.5) * 1e3:.2f} / "
          f"{pct(f, 0.99) * 1e3:.2f} ({len(f)} binds); ratio p50 {pct(q, 0.5) / pct(f, 0.5):.2f}")


def timed_bind(ext: Extender, pod: dict[str, Any], names: list[str]) -> float | None:
    """filter -> prioritize, then the bind call's wall time (None: not bound)."""
    passing = call(ext, "filter", {"Pod": pod, "NodeNames": names})["NodeNames"] or []
    if not passing:
        return None
    scores = call(ext, "prioritize", {"Pod": pod, "NodeNames": passing})
    best = max(scores, key=lambda h: h["Score"])["Host"]
    meta = pod["metadata"]
    began = time.perf_counter()
    answer = call(ext, "bind", {"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                "PodUID": meta["uid"], "Node": best})
    spent = time.perf_counter() - began
    return spent if answer["Error"] == "" else None


def report_watch(rows: list[tuple[str, dict[str, float]]]) -> None:
    print("\nwatch threads' CPU per bound pod (µs): the pod MODIFIED and GPULedger MODIFIED "
          "events a bind causes")
    print(f"{'watches through':18} {'pods':>8} {'ledgers':>8} {'total':>8} {'bound':>6}")
    for label, r in rows:
        pods, ledgers = r["informer-pods"], r["informer-gpuledgers"]
        print(f"{label:18} {pods:8.1f} {ledgers:8.1f} {pods + ledgers:8.1f} {r['bound']:6.0f}")


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writes", type=int, default=2000)
    parser.add_argument("--pods", type=int, default=400)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--part", choices=("writes", "watch", "quota", "all"), default="all")
    args = parser.parse_args()
    print(machine_line("before"))
    if args.part in ("writes", "all"):
        measure_writes(args.writes)
    if args.part in ("watch", "all"):
        report_watch([("KubeApi", measure_watch(args.nodes, args.pods, args.seed))])
    if args.part in ("quota", "all"):
        measure_quota(args.nodes, args.pods, args.seed)
    print(machine_line("after"))


if __name__ == "__main__":
    main()
