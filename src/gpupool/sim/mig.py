"""MIG in the simulator: a trace's pods served by MIG devices, static or on demand, against
today's sharing — on the same cluster, the same arrivals, the same protocol.

The cluster is the trace's MIG-capable nodes (``mig_nodes``): the GPU models given, each
GPU taken as an A100-SXM4-80GB (``STAND_IN``; of the Alibaba trace's models, T4, P100,
V100 and A10 have no MIG, and G2 and G3 are undisclosed: the study assumes them
A100-class). Three regimes (``Regime``):

* ``sharing``: the pods as they ask, slices of memory and compute (today's gpupool);
* ``static-balanced`` / ``static-fitted``: every GPU in MIG mode with a fixed layout —
  NVIDIA's *all-balanced* (mig-parted: 2 × 1g.10gb, 2g.20gb, 3g.40gb), or layouts fitted
  beforehand to the workload's profile mix (``fitted_layouts``: an operator who knew the
  mix); a pod takes a MIG device of its profile (``mig_request``) or waits;
* ``on-demand``: every GPU in MIG mode, empty at first; a pod no device fits gets the
  core's repartition (``core.repartition``: grow, or rebuild an idle GPU, least stranded
  compute slices for the workload's mix), then is placed.

A pod's profile is the smallest whose compute share covers what it asks: a slice of
``c`` % takes ``⌈7c/100⌉`` compute slices, rounded up to a profile (1g, 2g, 3g, 4g; 5 and
6 slices take a 7g); a whole GPU takes a 7g.80gb (N whole GPUs: N of them, on one node).

Arrivals follow the FGD protocol (``sim.protocol.arrival_order``, ``node_order``: the
same seeds give the same order in every regime) and the same policy places each pod. At
the first pod where the arrived demand reaches the GPU capacity the run reports the
unallocated GPU % (capacity no pod holds: a MIG device counts its compute slices, 1/7 of
a GPU each, whether its pod uses all of it or not), the demand served (the asks of the
pods placed, as % of capacity) and the pods served.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum

from gpupool.core import mig
from gpupool.core.allocation import Allocation
from gpupool.core.fit import NO_CONSTRAINTS
from gpupool.core.model import Node
from gpupool.core.placement import Placer
from gpupool.core.policies import make_policy
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.repartition import Planner, apply, partitioned
from gpupool.core.request import GpuDemand, Mode, PodRequest, merged_demand
from gpupool.core.state import ClusterState
from gpupool.sim.protocol import arrival_order
from gpupool.sim.scenario import demand_milli

STAND_IN = ("A100-SXM4-80GB", 80 * 1024)
GEOMETRY = mig.by_name("A100-80GB")
BY_SLICES = {1: "1g.10gb", 2: "2g.20gb", 3: "3g.40gb", 4: "4g.40gb", 5: "7g.80gb",
             6: "7g.80gb", 7: "7g.80gb"}
BALANCED = (("1g.10gb", 0), ("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 4))
"""NVIDIA mig-parted's all-balanced layout for a 7-slice GPU: 2 × 1g, 1 × 2g, 1 × 3g."""


class Regime(Enum):
    SHARING = "sharing"
    STATIC_BALANCED = "static-balanced"
    STATIC_FITTED = "static-fitted"
    ON_DEMAND = "on-demand"


@dataclass(frozen=True, slots=True)
class MigRun:
    """One (regime, seed) run, read when the arrived demand reached the capacity."""

    regime: str
    policy: str
    seed: int
    gpus: int
    arrived_pods: int  # GPU pods arrived by the headline
    served_pods: int  # of them, placed
    unallocated_pct: float
    demand_served_pct: float
    repartitions: int
    wall_s: float

    @property
    def served_pct(self) -> float:
        return 100.0 * self.served_pods / max(self.arrived_pods, 1)


def mig_nodes(nodes: Sequence[Node], models: frozenset[str]) -> list[Node]:
    """The nodes whose GPUs are of ``models``, each GPU made the A100 80GB stand-in."""
    model, memory = STAND_IN
    return [replace(n, gpus=tuple(replace(g, model=model, memory_mib=memory) for g in n.gpus))
            for n in nodes if n.gpus and n.model in models]


def mig_request(request: PodRequest) -> PodRequest:
    """The pod asking MIG devices instead: its profile by the compute it asks."""
    d = merged_demand(request)
    if d.exclusive:
        profile, count = "7g.80gb", d.count
    else:
        profile, count = BY_SLICES[max(1, math.ceil(d.core_pct * 7 / 100))], d.count
    return replace(request, models=None, gpus=(GpuDemand(count, mode=Mode.EXCLUSIVE,
                                                         mig_profile=profile),))


def profile_mix(requests: Sequence[PodRequest]) -> dict[str, float]:
    """Each profile's share of the MIG devices the workload asks."""
    counts: Counter[str] = Counter()
    for r in requests:
        if r.gpus:
            d = merged_demand(r)
            counts[d.mig_profile] += d.count
    return {k: float(v) for k, v in counts.items()}


def fitted_layouts(mix: Mapping[str, float], gpus: int) -> list[tuple[tuple[str, int], ...]]:
    """``gpus`` layouts whose devices follow ``mix`` (by compute slices asked), each GPU
    filled first-fit with the profile furthest below its share, by NVIDIA's placements."""
    total = sum(mix.values()) or 1.0
    slices = {p: w * mig.slices_of(p) for p, w in mix.items()}
    whole = sum(slices.values()) or 1.0
    target = {p: s / whole * gpus * mig.COMPUTE_SLICES / mig.slices_of(p)
              for p, s in slices.items()}
    made: Counter[str] = Counter()
    out = []
    for _ in range(gpus):
        devices: list[mig.MigDevice] = []
        while True:
            options = sorted(((made[p] - t) / max(t, 1e-9), p) for p, t in target.items()
                             if mig.free_starts(GEOMETRY, devices, p))
            if not options or total == 0:
                break
            _, p = options[0]
            devices.append(mig.device_at(GEOMETRY, "gpu", p,
                                         mig.free_starts(GEOMETRY, devices, p)[0]))
            made[p] += 1
        out.append(tuple((d.profile, d.start) for d in devices))
    return out


def _partition(nodes: Sequence[Node], layouts: Sequence[tuple[tuple[str, int], ...]]
               ) -> list[Node]:
    it = iter(layouts)
    out = []
    for n in nodes:
        out.append(partitioned(n, {g.uuid: [mig.device_at(GEOMETRY, g.uuid, p, s)
                                            for p, s in next(it)] for g in n.gpus}))
    return out


def run_regime(regime: Regime, nodes: Sequence[Node], requests: Sequence[PodRequest],
               seed: int, inflate: float = 1.3, policy: str = "best-fit",
               config: PolicyConfig | None = None) -> MigRun:
    """One run of ``regime`` on ``nodes`` (already ``mig_nodes``) with the FGD protocol
    (``policy`` places every pod; ``config`` is its target workload and weights)."""
    started = time.perf_counter()
    ordered = list(nodes)
    random.Random(seed * 1_000_003 + 1).shuffle(ordered)
    gpus = sum(len(n.gpus) for n in ordered)
    arrivals = arrival_order(list(requests), gpus * 1000, inflate, random.Random(seed))
    asked = [demand_milli(r) for r in arrivals]
    if regime is not Regime.SHARING:
        arrivals = [mig_request(r) if r.gpus else r for r in arrivals]
    mix = profile_mix(arrivals) if regime is not Regime.SHARING else {}
    ordered = _initial(regime, ordered, mix)
    state = ClusterState(ordered)
    placer = Placer(make_policy(policy, config or PolicyConfig()))
    rng = random.Random(seed * 1_000_003 + 7)
    planner = Planner()
    arrived = served = demand = repartitions = 0
    full, total = gpus * 1000, 0
    for k, request in enumerate(arrivals):
        if total >= full:
            break
        total += asked[k]
        alloc = placer.decide(state, request, rng).allocation
        if alloc is None and regime is Regime.ON_DEMAND:
            chosen = planner.plan(state, request, NO_CONSTRAINTS, mix)
            if chosen is not None:
                apply(state, chosen)
                repartitions += len(chosen.changes)
                alloc = placer.decide(state, request, rng).allocation
        arrived += bool(request.gpus)
        if alloc is not None:
            state.reserve(alloc)
            served += bool(request.gpus)
            demand += asked[k]
    used = _allocated_milli(state, regime)
    return MigRun(regime.value, policy, seed, gpus, arrived, served,
                  round(100.0 - 100.0 * used / full, 4), round(100.0 * demand / full, 4),
                  repartitions, round(time.perf_counter() - started, 3))


def _initial(regime: Regime, nodes: list[Node], mix: Mapping[str, float]) -> list[Node]:
    gpus = sum(len(n.gpus) for n in nodes)
    if regime is Regime.SHARING:
        return nodes
    if regime is Regime.STATIC_BALANCED:
        return _partition(nodes, [BALANCED] * gpus)
    if regime is Regime.STATIC_FITTED:
        return _partition(nodes, fitted_layouts(mix, gpus))
    return _partition(nodes, [()] * gpus)


def _allocated_milli(state: ClusterState, regime: Regime) -> int:
    """Capacity held by pods: the usage for slices; for MIG devices, their compute."""
    if regime is Regime.SHARING:
        return state.usage().allocated_milli
    return sum(_device_milli(state, a) for a in state.allocations.values())


def _device_milli(state: ClusterState, alloc: Allocation) -> int:
    node = state.nodes[state.node_index(alloc.node)]
    return sum(mig.slices_of(node.gpus[s.gpu_position].mig_profile) * 1000
               // mig.COMPUTE_SLICES for s in alloc.slices)
