"""Benchmark of choosing the victims for a whole gang (``core.victims_gang.select_gang``)
against choosing them for one pod (``core.victims.select`` with ``Room``), same cluster,
same run.

    .venv/bin/python bench/bench_gang_preemption.py [--nodes 500 5000] [--members 8 64]

A cluster of N nodes × 8 GPUs of 80 GiB, full: two 40 GiB pods per GPU, priorities drawn
from 0–99. The pod (or each gang member) asks 40 GiB of one GPU at priority 1000, so each
needs one victim. Printed per size: the single pod's choice (the baseline), the gang's
choice, the ratio, and the gang's choice per member. The gang's choice runs on the
extender's planner thread, off the cache lock (docs/design/preemption.md, "Room for a
gang").
"""

from __future__ import annotations

import argparse
import random
import time

from bench_preemption import GIB, cluster

from gpupool.core.gang import Gang
from gpupool.core.policies import make_policy
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.request import GpuDemand, Mode, PodRequest
from gpupool.core.state import ClusterState
from gpupool.core.victims import Candidate, Room, Selection, below, select
from gpupool.core.victims_gang import GangRoom, GangSelection, select_gang

ASK = GpuDemand(1, 40 * GIB, 0, Mode.SHARED)


def full(nodes: int, seed: int) -> tuple[ClusterState, list[Candidate]]:
    """Two 40 GiB pods on every GPU, priorities 0-99."""
    return cluster(nodes, 2, 40 * GIB, seed, same_priority=False)


def best_of(fn: object, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return min(times) * 1000, out


def run(nodes: int, members: int, repeat: int) -> None:
    state, cands = full(nodes, nodes)
    policy = make_policy("best-fit", PolicyConfig())
    one = PodRequest("p", 100, 256, (ASK,))
    single_ms, chosen = best_of(lambda: select(Room(state, one), cands, below(1000)), repeat)
    assert isinstance(chosen, Selection), chosen
    gang = Gang("g", tuple(PodRequest(f"g{i}", 100, 256, (ASK,))
                           for i in range(members)))
    gang_ms, picked = best_of(lambda: select_gang(
        GangRoom(state, gang, policy, random.Random(0)), cands, below(1000)), repeat)
    assert isinstance(picked, GangSelection), picked
    print(f"{nodes:>6} nodes {members:>3} members: one pod {single_ms:8.1f} ms | gang "
          f"{gang_ms:9.1f} ms ({gang_ms / single_ms:5.1f}x, {gang_ms / members:7.1f} ms a "
          f"member) | {len(picked.victims)} victims")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[500, 5000])
    ap.add_argument("--members", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    for n in args.nodes:
        for m in args.members:
            run(n, m, args.repeat)


if __name__ == "__main__":
    main()
