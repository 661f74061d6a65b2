"""Benchmark of preemption inside a tenant's quota: how long planning it holds the cache
lock, against a plain filter of the same pod measured in the same run.

    .venv/bin/python bench/bench_preemption_quota.py [--nodes 500 5000] [--repeat 5]

A cluster of N nodes × 8 GPUs of 80 GiB, full: two 40 GiB pods per GPU, every other one
of tenant ``team`` (namespace ``t``, random priorities 0–99; so ``team`` has 8·N pods),
the others of namespace ``o``. ``team``'s TenantQuota allows exactly the GPU memory its
pods hold, so a pod of ``team`` of priority 1000 asking 40 GiB is refused by the quota
(not permanently) and every sent node is full: the plan needs one of ``team``'s pods for
the quota and, with it gone, room on a sent node. Cases: ``mixed`` (every node sent; the
quota's victim frees room on a sent node) and ``apart`` (``team``'s pods on the first
half of the nodes, the other half sent, full of ``o``'s pods: the room must be made by
evicting one of those too, chosen in the recheck under the lock).

* ``filter``: the plain filter of the pod on an extender without preemption — the
  baseline;
* ``in filter``: the quota plan as filter made it, under the lock: the quotas' needs, the
  candidates built from the live cache over every node, the victims chosen on the live
  state, the room found on a sent node — what every other call waited for (the same
  functions, run as filter ran them);
* ``take`` / ``recheck``: what the plan holds the lock for when made on the planner
  thread (``planner.take``, then ``planner.recheck``); ``choose``: the part made off the
  lock (``planner.choose``);
* ``a filter arriving meanwhile``: a plain filter of another pod issued just as a plan
  starts (the plan's thread has the lock), the plan in filter against off it.
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from timing import timed

from gpupool.core.allocation import Allocation, Slice
from gpupool.core.model import uniform_node
from gpupool.core.quota import Charge, amount_of_allocation
from gpupool.core.request import GpuDemand, Mode, PodRequest
from gpupool.core.state import ClusterState
from gpupool.core.victims import Limits, NoVictims
from gpupool.extender.metrics import Metrics
from gpupool.extender.preemption import planner, tenantpreempt
from gpupool.extender.preemption.plans import Plan
from gpupool.extender.service import Extender, Settings
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.state.pods import PodFacts

GIB = 1024
DEMAND = GpuDemand(1, 40 * GIB, 0, Mode.SHARED)


def cache_of(nodes: int, seed: int, apart: bool) -> ClusterCache:
    """The full cluster, its pods placed by gpupool and charged, and ``team``'s quota
    (``apart``: ``team``'s pods fill the first half of the nodes, the others the rest)."""
    rng = random.Random(seed)
    cache = ClusterCache()
    cache.state = ClusterState([uniform_node(f"n{i}", 64000, 512 * GIB, 8, "A100", 80 * GIB)
                                for i in range(nodes)])
    used = 0
    for i, node in enumerate(cache.state.nodes):
        for j, gpu in enumerate(node.gpus):
            for k in range(2):
                ns = ("t" if i < nodes // 2 else "o") if apart else ("t" if k == 0 else "o")
                alloc = Allocation(f"{node.name}-{j}-{k}", node.name, 0, 0,
                                   (Slice(gpu.uuid, j, 40 * GIB, 50),))
                cache.state.reserve(alloc)
                f = PodFacts(alloc.key, ns, alloc.key, node.name, False, 0, 0, alloc, None,
                             None, True, rng.randint(0, 99))
                cache.pods[alloc.key] = f
                cache.pods_on.setdefault(node.name, set()).add(alloc.key)
                cache.sources[alloc.key] = {"pod"}
                cache.catalogue.quotas.charge(alloc.key, Charge(
                    amount_of_allocation(alloc), ns))
                used += 40 * GIB if ns == "t" else 0
    cache.tenant_quota_event("ADDED", {"metadata": {"name": "team"}, "spec": {
        "namespaces": ["t"], "limits": {"memoryMiB": used}}})
    return cache


def pod_of(name: str, ns: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "uid": name},
            "spec": {"priority": 1000, "containers": [{"name": "c", "resources": {
                "limits": {"gpupool.io/gpu-memory": str(DEMAND.memory_mib)}}}]}}


class Bench:
    def __init__(self, nodes: int, apart: bool):
        self.cache = cache_of(nodes, 0, apart)
        self.ext = Extender(self.cache, Settings("best-fit"), Metrics())
        self.request = PodRequest("urgent", 1000, 1024, (DEMAND,), tenant="t")
        self.pod, self.other = pod_of("urgent", "t"), pod_of("other", "o")
        self.rows = list(range(nodes // 2, nodes)) if apart else list(range(nodes))
        self.names = [self.cache.state.nodes[i].name for i in self.rows]
        self.constraints = self.cache.modes.constraints(self.cache.state, self.request,
                                                        self.cache.catalogue)
        assert tenantpreempt.is_quota_refusal(self.constraints), self.constraints

    def filter(self, pod: dict[str, Any]) -> object:
        return self.ext.filter({"Pod": pod, "NodeNames": self.names})

    def want(self) -> planner.Want:
        return planner.want_of(self.pod, self.request, self.constraints, self.cache.state,
                               self.rows, Limits(), quota=True)

    def in_filter(self) -> object:
        """The quota plan as filter made it, under the lock."""
        cache, key = self.cache, self.request.key
        with cache.lock, cache.without(key):
            wanted = tenantpreempt.needs(cache, self.request, 1000)
            assert not isinstance(wanted, NoVictims), wanted
            everyone = planner.placed_on(cache, key, range(len(cache.state.nodes)))
            chosen = tenantpreempt.choose(wanted, everyone, cache.state,
                                          cache.budgets.allowed(), Limits())
            if isinstance(chosen, NoVictims):
                return chosen
            return tenantpreempt.recheck(cache, wanted, self.want(), chosen,
                                         partial(planner.placed_on, cache),
                                         partial(planner.hold_on, cache,
                                                 self.ext._decide_on_row))

    def take(self) -> planner.Ask:
        with self.cache.lock:
            ask = planner.take(self.cache, self.want())
        assert isinstance(ask, planner.Ask), ask
        return ask

    def recheck(self, ask: planner.Ask, chosen: object) -> object:
        if not isinstance(chosen, tenantpreempt.Chosen):
            return chosen
        with self.cache.lock:
            self.cache.flush()
            return planner.recheck(self.cache, self.ext._decide_on_row, ask, chosen)

    def waits(self, plan: Callable[[threading.Event], object]) -> float:
        """Milliseconds a plain filter of another pod takes, arriving as a plan starts."""
        started = threading.Event()
        thread = threading.Thread(target=plan, args=(started,))
        thread.start()
        started.wait()
        start = time.perf_counter()
        self.filter(self.other)
        took = (time.perf_counter() - start) * 1000
        thread.join()
        return took

    def plan_in_filter(self, started: threading.Event) -> None:
        with self.cache.lock:
            started.set()
            self.in_filter()

    def plan_off_lock(self, started: threading.Event) -> None:
        with self.cache.lock:
            started.set()
            ask = self.take()
        self.recheck(ask, planner.choose(ask))


def measure(nodes: int, repeat: int, apart: bool) -> None:
    b = Bench(nodes, apart)
    base, _ = timed(lambda: b.filter(b.pod), repeat)
    before, found = timed(b.in_filter, repeat)
    take, ask = timed(b.take, repeat)
    assert isinstance(ask, planner.Ask)
    choose, chosen = timed(lambda: planner.choose(ask), repeat)
    recheck, outcome = timed(lambda: b.recheck(ask, chosen), repeat)
    waits_before = statistics.median(b.waits(b.plan_in_filter) for _ in range(repeat))
    waits_after = statistics.median(b.waits(b.plan_off_lock) for _ in range(repeat))
    what = found if isinstance(found, str) else \
        f"{len(getattr(found, 'victims', ()))} victims on {getattr(found, 'node', '')}"
    if not isinstance(outcome, Plan):
        what += f"; off the lock: {outcome}"
    print(f"{nodes:5d} nodes ({len(b.cache.pods)} pods, {'apart' if apart else 'mixed'}) "
          f" filter {base:7.1f} ms  {what}\n"
          f"{'':19s}lock held: in filter {before:8.1f} ms  now take {take:6.1f} + recheck "
          f"{recheck:6.1f} ms ({before / (take + recheck):6.1f}x less); choose (off the "
          f"lock) {choose:8.1f} ms\n"
          f"{'':19s}a filter arriving meanwhile takes: in filter {waits_before:8.1f} ms  "
          f"now {waits_after:7.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[500, 5000])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--cases", nargs="+", default=["mixed", "apart"])
    args = parser.parse_args()
    for n in args.nodes:
        for case in args.cases:
            measure(n, args.repeat, case == "apart")


if __name__ == "__main__":
    main()
