"""DRA's own allocation against gpupool's choice: the FGD protocol, five ways to place a claim.

On a DRA node kube-scheduler itself allocates a pod's ResourceClaims. What it does, as
its scheduler framework and the structured allocator (k8s.io/dynamic-resource-allocation)
do, and what of it matters for packing:

* **filter**: a node passes when its devices can hold the claims (consumable capacity per
  dimension; a request without capacity takes a whole device) and its CPU and memory the
  pod: the core's own fit, since gpupool's slices publish exactly its accounting;
* **score**: the default profile's NodeResourcesFit (``LeastAllocated`` on cpu and memory,
  weight 1 each: ``(allocatable - requested) * 100 / allocatable``, averaged) and
  NodeResourcesBalancedAllocation (``(1 - std(requested/allocatable)) * 100``), each
  weight 1; the DynamicResources plugin scores only the choice among ``firstAvailable``
  sub-requests, the other default plugins score every node of this cluster alike; nothing
  sees the GPUs. Requests of 0 count as 100m CPU and 200 MiB (kube-scheduler's non-zero
  requests). The highest total wins, ties uniformly at random (``selectHost``);
* **allocate**: the devices of the chosen node in slice order (gpupool publishes them by
  GPU index), the first that fit (first fit).

Pods without GPUs (13 % of the default trace) are never sent to gpupool in a cluster
(no extender entry is interested in them): every variant but ``gpupool`` places them the
default scheduler's way. The variants (``VARIANTS``):

``dra-first-fit``
    kube-scheduler alone, as above.
``gpupool-prioritize``
    kube-scheduler with gpupool's ``prioritize-claims``: the policy's scores of the
    candidate nodes scaled linearly to 0..10 (kube-scheduler's extender range, as the
    extender answers them), added times ``weight`` x 10 to the plugins' total (weight 5,
    the value docs/dra.md recommends; ``-w100``: weight 100); devices first fit.
``gpupool-prioritize-top``
    weight 100, and only the node the policy would choose scores 10 (every other node at
    most 9): kube-scheduler then takes exactly the policy's node.
``device-plugin``
    the device-plugin path as a cluster runs it: kube-scheduler chooses the node with
    gpupool's prioritize (weight 5), gpupool's bind the GPUs on it.
``gpupool-exact``
    the policy chooses node and GPU of every GPU pod.
``gpupool``
    the policy chooses for every pod, those without GPUs too: ``Placer.decide`` on every
    arrival, the same figures as ``gpupool simulate``.

Every variant runs the same arrival order, node order and seeds as ``sim.protocol``; the
headline is the unallocated GPU share when the arrived demand reaches the capacity. A
trace pod's GPU share becomes a claim asking that share (its cores, its memory), so all
variants place the same requests on the same accounting.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gpupool.core.allocation import Allocation
from gpupool.core.classes import ClassCatalog
from gpupool.core.eligibility import class_mask
from gpupool.core.errors import UnknownName
from gpupool.core.fit import NO_CONSTRAINTS, Constraints, demand_of
from gpupool.core.gpus import build_allocation
from gpupool.core.placement import Candidates, Placer, choose
from gpupool.core.policies import make_policy
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.request import PodRequest
from gpupool.core.scoring import Scores
from gpupool.core.state import ClusterState, IntArray
from gpupool.core.workload import TargetWorkload
from gpupool.sim.decision import policy_seed
from gpupool.sim.protocol import arrival_order, node_order
from gpupool.sim.scenario import Scenario, demand_milli

MAX_NODE_SCORE = 100  # kube-scheduler's framework.MaxNodeScore
MAX_EXTENDER_PRIORITY = 10  # extenderv1.MaxExtenderPriority
NON_ZERO_CPU_MILLI = 100  # kube-scheduler's default request of a container without one
NON_ZERO_MEMORY_MIB = 200
RECOMMENDED_WEIGHT = 5  # the main extender entry's weight; 100 measured the same


@dataclass(frozen=True, slots=True)
class Variant:
    """Who chooses the node (``kube``, ``prioritize``, ``policy``) and the device
    (``first-fit``, ``policy``); ``weight``: the extender's, for ``prioritize``."""

    name: str
    node: str
    device: str
    weight: int = 0
    top_only: bool = False  # prioritize: only the policy's choice scores 10 (else linear)
    cpu_pods_by_policy: bool = False  # pods without GPUs placed by the policy too


VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("dra-first-fit", "kube", "first-fit"),
    Variant("gpupool-prioritize", "prioritize", "first-fit", RECOMMENDED_WEIGHT),
    Variant("gpupool-prioritize-w100", "prioritize", "first-fit", 100),
    Variant("gpupool-prioritize-top", "prioritize", "first-fit", 100, top_only=True),
    Variant("device-plugin", "prioritize", "policy", RECOMMENDED_WEIGHT),
    Variant("gpupool-exact", "policy", "policy"),
    Variant("gpupool", "policy", "policy", cpu_pods_by_policy=True),
)}


def kube_scores(state: ClusterState, request: PodRequest, rows: IntArray) -> np.ndarray:
    """NodeResourcesFit (LeastAllocated) + NodeResourcesBalancedAllocation of ``rows`` with
    the pod on them, as kube-scheduler's integer arithmetic gives them."""
    cpu = max(request.cpu_milli, NON_ZERO_CPU_MILLI)
    mem = max(request.memory_mib, NON_ZERO_MEMORY_MIB)
    cpu_cap, mem_cap = state.cpu_cap[rows], state.mem_cap[rows]
    cpu_req = np.minimum(cpu_cap - state.cpu_free[rows] + cpu, cpu_cap)
    mem_req = np.minimum(mem_cap - state.mem_free[rows] + mem, mem_cap)
    safe_cpu, safe_mem = np.maximum(cpu_cap, 1), np.maximum(mem_cap, 1)
    least = ((cpu_cap - cpu_req) * MAX_NODE_SCORE // safe_cpu
             + (mem_cap - mem_req) * MAX_NODE_SCORE // safe_mem) // 2
    spread = np.abs(cpu_req / safe_cpu - mem_req / safe_mem) / 2  # std of two fractions
    balanced = ((1 - spread) * MAX_NODE_SCORE).astype(np.int64)
    return np.asarray(least + balanced, np.int64)


def extender_scores(values: np.ndarray, top_only: bool = False) -> np.ndarray:
    """Policy values mapped linearly onto 0..10; with ``top_only`` (what
    ``prioritize-claims`` answers) the node the policy would choose (``choose``: the best,
    ties to the first) alone gets 10 and every other node at most 9."""
    lo, hi = float(values.min()), float(values.max())
    if hi - lo <= 1e-12:
        scores = np.full(values.shape, MAX_EXTENDER_PRIORITY, np.int64)
    else:
        scores = np.rint((values - lo) * MAX_EXTENDER_PRIORITY / (hi - lo)).astype(np.int64)
    if top_only:
        scores = np.minimum(scores, MAX_EXTENDER_PRIORITY - 1)
        scores[int(np.argmax(values))] = MAX_EXTENDER_PRIORITY
    return scores


class DraDecider:
    """Places one request the variant's way; never changes the state."""

    def __init__(self, state: ClusterState, variant: Variant, policy: str,
                 config: PolicyConfig, seed: int, catalog: ClassCatalog):
        self.state = state
        self.variant = variant
        self.placer = Placer(make_policy(policy, config))
        self.rng = random.Random(policy_seed(seed))
        self.ties = random.Random(seed * 1_000_003 + 11)  # selectHost among equal totals
        self.catalog = catalog

    def decide(self, request: PodRequest) -> Allocation | None:
        c = self._constraints(request)
        cands = self.placer.candidates(self.state, request, c)
        if cands.indices.size == 0:
            return None
        if demand_of(request) is None and not self.variant.cpu_pods_by_policy:
            return self._first_fit(request, cands, self._kube_choice(request, cands, None))
        scores = None
        if self.variant.node != "kube":
            scores = self.placer.score(self.state, request, cands, self.rng)
        if self.variant.node == "policy":
            k = choose(scores.value, self.rng) if scores is not None else 0
        else:
            k = self._kube_choice(request, cands, scores)
        if self.variant.device == "policy" and scores is not None:
            return self.placer.allocate_on(self.state, request, cands, scores, k)
        return self._first_fit(request, cands, k)

    def _kube_choice(self, request: PodRequest, cands: Candidates, scores: Scores | None
                     ) -> int:
        """kube-scheduler's pick: its plugins' total plus, with the policy's ``scores``,
        the extender's 0..10 score times the weight x 10; ties uniformly at random."""
        total = kube_scores(self.state, request, cands.indices)
        if scores is not None:
            ext = extender_scores(scores.value, self.variant.top_only)
            total = total + ext * self.variant.weight * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)
        best = np.flatnonzero(total == total.max())
        return int(best[self.ties.randrange(best.size)])

    def _first_fit(self, request: PodRequest, cands: Candidates, k: int) -> Allocation:
        i = int(cands.indices[k])
        demand = demand_of(request)
        if demand is None or cands.gpu_fit is None:
            return build_allocation(self.state, request, i, [])
        positions = [int(p) for p in np.flatnonzero(cands.gpu_fit[i])[:demand.count]]
        return build_allocation(self.state, request, i, positions)

    def _constraints(self, request: PodRequest) -> Constraints:
        if request.gpu_class is None and request.selector is None:
            return NO_CONSTRAINTS
        mask, refusal = class_mask(self.state, request, self.catalog)
        return Constraints(gpu_mask=mask, blocked=refusal)


@dataclass(frozen=True, slots=True)
class DraRun:
    """One (variant, seed) run: figures at the moment arrived demand reaches capacity."""

    variant: str
    seed: int
    pods: int
    unallocated_gpu_pct: float
    stranded_gpu_pct: float  # free share on GPUs that are partly used, % of capacity
    failed_before_full: int
    wall_s: float


def run_variant(scenario: Scenario, variant: str, seed: int, inflate: float = 1.3,
                policy: str = "fgd-balance", config: PolicyConfig | None = None,
                progress: Callable[[int], None] | None = None) -> DraRun:
    """One run of the FGD protocol (``sim.protocol``) placing pods the variant's way."""
    try:
        spec = VARIANTS[variant]
    except KeyError:
        raise UnknownName(f"unknown variant {variant!r}; known: "
                          f"{', '.join(VARIANTS)}") from None
    state = ClusterState(node_order(scenario, seed))
    capacity = state.usage().capacity_milli
    order = arrival_order(scenario.requests, capacity, inflate, random.Random(seed))
    config = config or PolicyConfig(TargetWorkload.from_requests(scenario.requests))
    decider = DraDecider(state, spec, policy, config, seed,
                         ClassCatalog(scenario.classes))
    started = time.perf_counter()
    arrived = failed = 0
    for n, request in enumerate(order):
        allocation = decider.decide(request)
        if allocation is not None:
            state.reserve(allocation)
        else:
            failed += 1
        arrived += demand_milli(request)
        if progress is not None:
            progress(n)
        if arrived >= capacity:
            break
    usage = state.usage()
    free = np.where(state.present, state.free_milli, 0)
    stranded = int(free[(free > 0) & (free < 1000)].sum())
    return DraRun(variant, seed, n + 1, round(100.0 - 100.0 * usage.allocated_milli / capacity, 4),
                  round(100.0 * stranded / capacity, 4), failed,
                  round(time.perf_counter() - started, 3))
