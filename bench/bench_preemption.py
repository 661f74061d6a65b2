"""Benchmark of preemption planning: what choosing victims costs a filter call.

    .venv/bin/python bench/bench_preemption.py [--nodes 500 5000] [--repeat 5]

When filter finds no node for a pod that may preempt, the extender chooses the victims
with the core (``core.victims.select``) under its cache lock, before it answers. This
prints, for a cluster of N nodes × 8 GPUs of 80 GiB that is full, per case:

* ``filter``: the plain filter of the pod (every node refused, reasons explained) on an
  extender without preemption — the baseline, measured in the same run;
* ``plan``: ``victims.select`` over the same nodes with the candidates the extender
  builds (its own figure: what preemption adds to that filter call), and the ratio;
* the victims chosen and whether the answer is exact.

Cases: ``one``: two 40 GiB pods per GPU, the pod asks 40 GiB (one victim);
``many``: eight 10 GiB pods per GPU, the pod asks a whole GPU (eight victims on one GPU:
past ``Limits.trials`` the answer is the greedy, minimal set); ``none``: every pod has
the preemptor's priority (no candidate; the cheapest refusal).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from gpupool.core.allocation import Allocation, Slice
from gpupool.core.model import uniform_node
from gpupool.core.request import GpuDemand, Mode, PodRequest
from gpupool.core.state import ClusterState
from gpupool.core.victims import Candidate, Room, Selection, below, select
from gpupool.extender.cache import ClusterCache
from gpupool.extender.metrics import Metrics
from gpupool.extender.service import Extender, Settings

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


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), out


def run(nodes: int, repeat: int) -> None:
    for name, (per_gpu, mib, demand) in CASES.items():
        state, cands = cluster(nodes, per_gpu, mib, 0, name == "none")
        measure(name, state, cands, demand, repeat)


def measure(name: str, state: ClusterState, cands: list[Candidate], demand: GpuDemand,
            repeat: int) -> None:
    request = PodRequest("urgent", 1000, 1024, (demand,), tenant="t")
    cache = ClusterCache()
    cache.state = state
    ext = Extender(cache, Settings("best-fit"), Metrics())
    pod = {"metadata": {"name": "urgent", "namespace": "t", "uid": "urgent"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": _limits(demand)}}]}}
    names = [n.name for n in state.nodes]
    base, _ = timed(lambda: ext.filter({"Pod": pod, "NodeNames": names}), repeat)
    plan_ms, chosen = timed(lambda: select(Room(state, request), cands, below(1000)), repeat)
    if isinstance(chosen, Selection):
        what = f"{len(chosen.victims)} victims on {chosen.node}, exact={chosen.exact}"
    else:
        what = str(getattr(chosen, "message", ""))[:40]
    print(f"{len(state.nodes):5d} nodes  {name:5s}  filter {base:8.1f} ms  plan {plan_ms:8.1f} "
          f"ms  plan/filter {plan_ms / base:6.1f}  {what}")


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
