"""Benchmark of preemption planning: what choosing victims costs, and what it costs the
other calls of the extender.

    .venv/bin/python bench/bench_preemption.py [--nodes 500 5000] [--repeat 5]

When filter finds no node for a pod that may preempt, the extender chooses the victims
with the core (``core.victims.select``). It used to do so in the filter call, under the
cache lock; it now takes what the plan needs under the lock (``planner.take``), chooses
without it (``planner.choose``) and checks the plan again under it (``planner.recheck``).
For a cluster of N nodes × 8 GPUs of 80 GiB that is full (every node sent), per case:

* ``filter``: the plain filter of the pod (every node refused, reasons explained) on an
  extender without preemption — the baseline, measured in the same run;
* ``select``: ``victims.select`` alone over the same nodes, and its ratio to the filter;
* ``locked (before)``: what the plan held the lock for when made under it — the
  candidates built from the cache, ``select`` on the live state, the pod's place decided
  on the chosen node (what filter did before; run here as it ran);
* ``take`` / ``recheck``: what the plan holds the lock for now, before and after choosing;
* ``a filter arriving meanwhile``: how long a plain filter call of another pod takes
  when it arrives just as a plan starts (the plan's thread has the lock) — the plan made
  under the lock (before: it waits for the whole plan), or off it (after: it waits for
  ``take``, then shares the interpreter with the choosing thread) — and the ratio.

Cases: ``one``: two 40 GiB pods per GPU, the pod asks 40 GiB (one victim);
``many``: eight 10 GiB pods per GPU, the pod asks a whole GPU (eight victims on one GPU:
past ``Limits.trials`` the answer is the greedy, minimal set); ``none``: every pod has
the preemptor's priority (no candidate; the cheapest refusal).
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from typing import Any

from timing import timed

from gpupool.core.allocation import Allocation, Slice
from gpupool.core.model import uniform_node
from gpupool.core.request import GpuDemand, Mode, PodRequest
from gpupool.core.state import ClusterState
from gpupool.core.victims import Candidate, Limits, Room, Selection, below, select
from gpupool.extender.metrics import Metrics
from gpupool.extender.preemption import planner
from gpupool.extender.service import Extender, Settings
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.state.pods import PodFacts

GIB = 1024
CASES = {
    "one": (2, 40 * GIB, GpuDemand(1, 40 * GIB, 0, Mode.SHARED)),
    "many": (8, 10 * GIB, GpuDemand(1, mode=Mode.EXCLUSIVE)),
    "none": (2, 40 * GIB, GpuDemand(1, 40 * GIB, 0, Mode.SHARED)),
}


def cluster(nodes: int, per_gpu: int, mib: int, seed: int, same_priority: bool
            ) -> tuple[ClusterState, list[Candidate]]:
    rng = random.Random(seed)
    state = ClusterState([uniform_node(f"n{i}", 64000, 512 * GIB, 8, "A100", 80 * GIB)
                          for i in range(nodes)])
    cands = []
    for node in state.nodes:
        for j, gpu in enumerate(node.gpus):
            for k in range(per_gpu):
                alloc = Allocation(f"{node.name}-{j}-{k}", node.name, 0, 0,
                                   (Slice(gpu.uuid, j, mib, 100 // per_gpu),))
                state.reserve(alloc)
                cands.append(Candidate(alloc, 1000 if same_priority else rng.randint(0, 99)))
    return state, cands


def cache_of(state: ClusterState, cands: list[Candidate]) -> ClusterCache:
    """A cache holding ``state`` whose pods are the candidates, placed by gpupool."""
    cache = ClusterCache()
    cache.state = state
    for c in cands:
        a = c.allocation
        cache.pods[a.key] = PodFacts(a.key, "low", a.key, a.node, False, 0, 0, a, None, None,
                                     True, c.priority)
        cache.pods_on.setdefault(a.node, set()).add(a.key)
        cache.sources[a.key] = {"pod"}
    return cache


def run(nodes: int, repeat: int) -> None:
    for name, (per_gpu, mib, demand) in CASES.items():
        state, cands = cluster(nodes, per_gpu, mib, 0, name == "none")
        measure(name, state, cands, demand, repeat)


class Bench:
    """One case: the cache, an extender without preemption, the pod and its ask."""

    def __init__(self, state: ClusterState, cands: list[Candidate], demand: GpuDemand):
        self.request = PodRequest("urgent", 1000, 1024, (demand,), tenant="t")
        self.cache = cache_of(state, cands)
        self.ext = Extender(self.cache, Settings("best-fit"), Metrics())
        self.pod = {"metadata": {"name": "urgent", "namespace": "t", "uid": "urgent"},
                    "spec": {"priority": 1000, "containers": [
                        {"name": "c", "resources": {"limits": _limits(demand)}}]}}
        self.other = {**self.pod, "metadata": {"name": "other", "namespace": "t",
                                               "uid": "other"}}
        self.names = [n.name for n in state.nodes]
        self.rows = list(range(len(state.nodes)))
        self.constraints = self.cache.modes.constraints(state, self.request,
                                                        self.cache.catalogue)

    def filter(self, pod: dict[str, Any]) -> object:
        return self.ext.filter({"Pod": pod, "NodeNames": self.names})

    def before(self) -> object:
        """The plan as filter made it under the lock: candidates from the cache, the
        choice on the live state, the pod's place on the chosen node."""
        cands = planner.placed_on(self.cache, "urgent", self.rows)
        chosen = select(Room(self.cache.state, self.request, self.constraints, self.rows),
                        cands, below(1000), self.cache.budgets.allowed(), Limits())
        if isinstance(chosen, Selection):
            return planner.hold_on(self.cache, self.ext._decide_on_row, self.request,
                                   self.constraints, chosen.node or "", chosen, cands)
        return chosen

    def take(self) -> planner.Ask:
        ask = planner.take(self.cache, planner.want_of(
            self.pod, self.request, self.constraints, self.cache.state, self.rows, Limits()))
        assert ask is not None
        return ask

    def recheck(self, ask: planner.Ask, chosen: object) -> object:
        if not isinstance(chosen, Selection):
            return chosen
        with self.cache.lock:
            self.cache.flush()
            return planner.recheck(self.cache, self.ext._decide_on_row, ask, chosen)

    def waits(self, off_lock: bool) -> float:
        """Milliseconds a plain filter of another pod takes, arriving as a plan starts."""
        started = threading.Event()

        def plan() -> None:
            if off_lock:
                with self.cache.lock:
                    started.set()
                    ask = self.take()
                self.recheck(ask, planner.choose(ask))
            else:
                with self.cache.lock:
                    started.set()
                    self.before()

        thread = threading.Thread(target=plan)
        thread.start()
        started.wait()
        start = time.perf_counter()
        self.filter(self.other)
        took = (time.perf_counter() - start) * 1000
        thread.join()
        return took


def measure(name: str, state: ClusterState, cands: list[Candidate], demand: GpuDemand,
            repeat: int) -> None:
    b = Bench(state, cands, demand)
    base, _ = timed(lambda: b.filter(b.pod), repeat)
    plan_ms, chosen = timed(lambda: select(Room(state, b.request), cands, below(1000)), repeat)
    before, _ = timed(lambda: b.before(), repeat)
    take, ask = timed(lambda: b.take(), repeat)
    assert isinstance(ask, planner.Ask)
    chosen_off = planner.choose(ask)
    recheck, outcome = timed(lambda: b.recheck(ask, chosen_off), repeat)
    waits_before = statistics.median(b.waits(False) for _ in range(repeat))
    waits_after = statistics.median(b.waits(True) for _ in range(repeat))
    if isinstance(chosen, Selection):
        what = f"{len(chosen.victims)} victims on {chosen.node}, exact={chosen.exact}"
        what += "" if isinstance(outcome, planner.Plan) else f"; recheck: {outcome}"
    else:
        what = str(getattr(chosen, "message", ""))[:40]
    print(f"{len(state.nodes):5d} nodes  {name:5s}  filter {base:7.1f} ms  select "
          f"{plan_ms:7.1f} ms ({plan_ms / base:5.1f}x filter)  {what}\n"
          f"{'':19s}lock held: before {before:7.1f} ms  after take {take:6.1f} + recheck "
          f"{recheck:5.1f} ms  ({before / (take + recheck):5.1f}x less)\n"
          f"{'':19s}a filter arriving meanwhile takes: before {waits_before:7.1f} ms  "
          f"after {waits_after:6.1f} ms  ({waits_before / waits_after:5.1f}x less)")


def _limits(d: GpuDemand) -> dict[str, str]:
    if d.exclusive:
        return {"gpupool.io/gpu": str(d.count)}
    return {"gpupool.io/gpu-memory": str(d.memory_mib)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[500, 5000])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    for n in args.nodes:
        run(n, args.repeat)


if __name__ == "__main__":
    main()
