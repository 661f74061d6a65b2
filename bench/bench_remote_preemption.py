"""Benchmark of the controller's preemption for remote slices: one planning round.

    .venv/bin/python bench/bench_remote_preemption.py [--nodes 1000 5000] [--pending 1 10 100]
                                                      [--repeat 3]

``RemotePlanner.plan`` (``controller/remotepreempt.py``) runs once per controller round
in which a pending ``remote-required`` pod may preempt: it builds the planning state from
what the controller observed (every GPU, every counted decision), counts the live holds in
the GPULedgers, and chooses victims for each pending pod with the core
(``core.victims.select``). Cluster: N GPU nodes × 8 GPUs of 80 GiB, each GPU holding two
40 GiB pods of random priority 0–99 (one GPU in twenty holds one: mostly full), ten live
holds of other pods in the ledgers; P pending remote-required pods of priority 1000 asking
60 GiB each (room only by eviction). Per case, medians of ``--repeat`` rounds:

* ``baseline``: the core's plain feasibility check for the same pods in the same run —
  the same state built from the same observation, then ``core.fit.feasible`` for each
  pod's slice (what finding no room costs without planning);
* ``plan``: one round of ``RemotePlanner.plan`` (a fresh planner each time), and its
  ratio to the baseline; and per pending pod.
"""

from __future__ import annotations

import argparse
import random
from functools import partial
from typing import Any

from timing import timed

from gpupool.contract import names
from gpupool.contract.ledger import HOLD, Entry, View, stamp
from gpupool.contract.podspec_request import pod_request
from gpupool.controller.observed import Observed, PlacedGpu, PodHolding
from gpupool.controller.remotepreempt import PreemptionConfig, RemotePlanner, preemption_state
from gpupool.core.allocation import Allocation, Slice
from gpupool.core.fit import feasible
from gpupool.core.model import Gpu
from gpupool.core.serving import slice_of

GIB = 1024
NOW = 1767229200.0
HOLDS = 10


def observed(nodes: int, seed: int) -> tuple[Observed, dict[str, View]]:
    """The cluster as the controller observes it, and the ledgers with ``HOLDS`` holds."""
    rng = random.Random(seed)
    gpus, holdings = [], []
    for i in range(nodes):
        node = f"g{i}"
        for j in range(8):
            gpu = Gpu(f"GPU-{node}-{j}", j, "A100", 80 * GIB)
            gpus.append(PlacedGpu(node, gpu))
            for k in range(1 if (i * 8 + j) % 20 == 0 else 2):
                key = f"{node}-{j}-{k}"
                alloc = Allocation(key, node, 0, 0, (Slice(gpu.uuid, j, 40 * GIB, 50),))
                holdings.append(PodHolding(key, f"low/{key}", "low", None, None, alloc,
                                           NOW - 3600, rng.randint(0, 99)))
    views = {}
    for h in range(HOLDS):
        node = f"g{h * (nodes // HOLDS)}"
        victim = f"{node}-1-0"
        alloc = Allocation(f"held-{h}", node, 0, 0,
                           (Slice(f"GPU-{node}-1", 1, 40 * GIB, 50),))
        entry = Entry(alloc, f"lab/held-{h}", stamp(NOW - 5), kind=HOLD,
                      expires=stamp(NOW + 100), displaces=(victim,))
        views[node] = View(node, "1", {f"held-{h}": entry})
    return Observed(tuple(gpus), (), (), tuple(holdings)), views


def pending(count: int) -> list[dict[str, Any]]:
    return [{"metadata": {"name": f"p{i}", "namespace": "lab", "uid": f"uid-p{i}",
                          "creationTimestamp": "2026-01-01T00:00:00Z",
                          "annotations": {names.ANNOTATION_PLACEMENT: "remote-required"}},
             "spec": {"priority": 1000, "containers": [{
                 "name": "main", "image": "train", "resources": {"limits": {
                     names.RESOURCE_REMOTE_GPU: "1", names.RESOURCE_MEMORY: str(60 * GIB),
                     names.RESOURCE_CORE: "10"}}}]},
             "status": {"phase": "Pending", "conditions": [{
                 "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}
            for i in range(count)]


def baseline(obs: Observed, pods: list[dict[str, Any]]) -> int:
    state = preemption_state(obs)
    return sum(bool(feasible(state, slice_of(pod_request(p)))[0].any()) for p in pods)


def plan(obs: Observed, views: dict[str, View], pods: list[dict[str, Any]]) -> int:
    planner = RemotePlanner(PreemptionConfig(per_minute=10**6))
    found = planner.plan(obs, pods, {}, None, NOW, views)
    return len([p for p in found.preemptions if not p.deferred])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--pending", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print("| GPU nodes | pending pods | baseline: feasibility | plan | ratio | plan per pod "
          "| planned |")
    print("|---|---|---|---|---|---|---|")
    for nodes in args.nodes:
        obs, views = observed(nodes, 42)
        for count in args.pending:
            pods = pending(count)
            base_ms, fits = timed(partial(baseline, obs, pods), args.repeat)
            plan_ms, planned = timed(partial(plan, obs, views, pods), args.repeat)
            assert fits == 0, "the bench's pods must need an eviction"
            print(f"| {nodes:,} | {count} | {base_ms:.1f} ms | {plan_ms:.1f} ms | "
                  f"×{plan_ms / base_ms:.1f} | {plan_ms / count:.2f} ms | {planned} |",
                  flush=True)


if __name__ == "__main__":
    main()
