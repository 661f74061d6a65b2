"""The FGD paper's evaluation protocol (Weng et al., USENIX ATC 2023).

For one seed:

1. ``rng = random.Random(seed)``; shuffle the trace pods with it;
2. append pods drawn with replacement from the (unshuffled) trace with the same
   ``rng`` until the total GPU demand Σ num_gpu × gpu_milli reaches
   ``inflate`` × the cluster's GPU capacity (the paper's "workload inflation");
3. list the nodes in a random order drawn with ``random.Random(seed * 1_000_003 + 1)``
   (the authors' harness prefixes node names with a seeded permutation, and
   ``Placer`` gives ties to the first node in node order, so this is what makes
   seeds independent samples of tie-breaking too);
4. place the pods one at a time in that order, never releasing any, with
   ``Placer.decide`` and a separate policy generator
   ``random.Random(seed * 1_000_003 + 7)``; reserve every allocation;
5. after every pod record the arrived GPU demand (every pod that arrived,
   placed or not) and the allocated GPU (``ClusterState.usage``), both as % of
   capacity.

The headline is the **unallocated GPU %**: 100 − allocation % at the first pod
where the arrived demand reaches 100 % of capacity. With remote slices
(``gpupool.sim.remote``) the run also reports, at the same pod, where the GPU pods'
slices were served.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gpupool.core.errors import InvalidInput
from gpupool.core.model import Node
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.request import PodRequest
from gpupool.core.serving import ZONE_LABEL
from gpupool.core.state import ClusterState
from gpupool.sim.decision import Decider
from gpupool.sim.failure import FailureTally
from gpupool.sim.remote import RemoteMode, ServingTally, SliceCounts
from gpupool.sim.scenario import Scenario, demand_milli
from gpupool.sim.window import ALL_NODES

FloatArray = npt.NDArray[np.float64]
Progress = Callable[[int], None]

CURVE_STEP_PCT = 0.5
"""The curve is kept at every 0.5 % of arrived demand (the value at the first pod
reaching each step), which is the resolution of the plot and the CSV."""
PROGRESS_EVERY = 500


@dataclass(frozen=True, slots=True)
class ProtocolRun:
    """Outcome of one (policy, seed) run of the protocol."""

    policy: str
    seed: int
    pods: int
    unallocated_gpu_pct: float
    failed_pods: int
    failed_before_full: int
    failures_by_kind: dict[str, int]
    failures_by_reason: dict[str, int]
    curve_arrived_pct: tuple[float, ...]
    curve_allocated_pct: tuple[float, ...]
    wall_s: float
    decision_median_ms: float
    decision_p99_ms: float
    decision_total_s: float  # Σ Placer.decide; wall_s minus this is the simulator's own cost
    nodes_to_score: int = ALL_NODES  # kube-scheduler's percentageOfNodesToScore (0: adaptive)
    bounced_pods: int = 0  # placed only after kube-scheduler's first window was refused
    workload_refreshes: int = 0  # times the policy re-learned its workload (--learn)
    remote: str = RemoteMode.OFF.value  # --remote: the placement every GPU pod carried
    slices: SliceCounts = field(default_factory=SliceCounts)  # at the headline pod

    def summary(self) -> dict[str, object]:
        """The run's line in summary.json (the curve goes to the CSV)."""
        row = dataclasses.asdict(self)
        del row["curve_arrived_pct"], row["curve_allocated_pct"]
        return row


def arrival_order(pods: Sequence[PodRequest], capacity_milli: int, inflate: float,
                  rng: random.Random) -> list[PodRequest]:
    """Shuffled trace, then resampled pods until demand ≥ ``inflate`` × capacity."""
    if inflate < 1.0:
        raise InvalidInput(f"inflate must be >= 1.0 (got {inflate}): the headline is read "
                           "when arrived demand reaches 100 % of capacity")
    demand = [demand_milli(p) for p in pods]
    if not sum(demand):
        raise InvalidInput("the workload asks for no GPU; the protocol needs GPU demand")
    if capacity_milli <= 0:
        raise InvalidInput("the cluster has no GPU; the protocol needs GPU capacity")
    order = list(pods)
    rng.shuffle(order)
    total, target, copies = sum(demand), inflate * capacity_milli, 0
    while total < target:
        k = rng.randrange(len(pods))
        copies += 1
        order.append(dataclasses.replace(pods[k], key=f"{pods[k].key}~{copies}"))
        total += demand[k]
    return order


def node_order(scenario: Scenario, seed: int) -> list[Node]:
    """The cluster's nodes in the seed's random order (step 3 of the protocol)."""
    nodes = list(scenario.nodes)
    random.Random(seed * 1_000_003 + 1).shuffle(nodes)
    return nodes


def run_protocol(scenario: Scenario, policy: str, seed: int, inflate: float,
                 config: PolicyConfig, progress: Progress | None = None,
                 nodes_to_score: int = ALL_NODES, learn_every: float | None = None,
                 remote: RemoteMode = RemoteMode.OFF, domains: tuple[str, ...] = (ZONE_LABEL,)
                 ) -> ProtocolRun:
    """One run of the protocol; ``progress`` is told how many pods were placed since last
    call; ``nodes_to_score`` < 100: each pod sees kube-scheduler's window of nodes only;
    ``learn_every``: the policy learns its workload every that many arrivals; ``remote``:
    the GPU pods' placement, ``domains`` the topology labels remote slices prefer."""
    rng = random.Random(seed)
    state = ClusterState(node_order(scenario, seed))
    capacity = state.usage().capacity_milli
    order = arrival_order([remote.asked(r) for r in scenario.requests], capacity, inflate, rng)
    decider = Decider(state, policy, config, seed, scenario.classes, nodes_to_score, learn_every,
                      remote, domains)
    demands = [demand_milli(r) for r in order]
    served = ServingTally(state, len(order), domains)
    started = time.perf_counter()
    allocated, decision_s, tally = _place_all(decider, order, demands, progress, served)
    wall = time.perf_counter() - started
    arrived_milli = np.cumsum(demands)
    full = int(np.searchsorted(arrived_milli, capacity, side="left"))
    arrived = np.asarray(arrived_milli * (100.0 / capacity), np.float64)
    allocated_pct = np.asarray(allocated * (100.0 / capacity), np.float64)
    xs, ys = curve(arrived, allocated_pct)
    return ProtocolRun(
        policy, seed, len(order), round(100.0 - float(allocated_pct[full]), 6), tally.total,
        tally.before(full + 1), tally.by_kind(), tally.by_reason(), xs, ys, round(wall, 4),
        round(float(np.median(decision_s)) * 1e3, 4),
        round(float(np.percentile(decision_s, 99)) * 1e3, 4), round(float(decision_s.sum()), 4),
        decider.window.percentage, decider.bounced,
        0 if decider.learner is None else decider.learner.refreshes, remote.value,
        served.counts(full + 1))


def _place_all(decider: Decider, order: Sequence[PodRequest], demands: Sequence[int],
               progress: Progress | None, served: ServingTally
               ) -> tuple[npt.NDArray[np.int64], FloatArray, FailureTally]:
    """The hot loop: decide, reserve, record. Nothing here copies or explains."""
    state = decider.state
    allocated = np.empty(len(order), np.int64)
    decision_s = np.empty(len(order), np.float64)
    tally = FailureTally(state)
    additive = all(asks_no_gpu_memory(r) for r in order)
    now, clock = 0, time.perf_counter
    for i, request in enumerate(order):
        t0 = clock()
        allocation = decider.decide(request, i)
        decision_s[i] = clock() - t0
        if allocation is not None:
            state.reserve(allocation)
            served.record(i, request, allocation, decider.last_tier)
            tally.changed()
            now = now + demands[i] if additive else state.usage().allocated_milli
        else:
            tally.record(i, request)
        allocated[i] = now
        if progress is not None and i % PROGRESS_EVERY == PROGRESS_EVERY - 1:
            progress(PROGRESS_EVERY)
    if progress is not None:
        progress(len(order) % PROGRESS_EVERY)
    if now != state.usage().allocated_milli:
        raise AssertionError(f"allocated GPU drifted: counted {now}, state says "
                             f"{state.usage().allocated_milli} milli-GPU")
    return allocated, decision_s, tally


def asks_no_gpu_memory(request: PodRequest) -> bool:
    """True when every GPU demand is whole GPUs or compute only.

    Then a GPU's used share (``ClusterState.usage``: the larger of its used
    compute and memory) grows by exactly the pod's demand, so the loop adds
    demands instead of summing the whole cluster after every pod; the total is
    checked against ``usage()`` at the end of the run.
    """
    return all(d.exclusive or d.memory_mib == 0 for d in request.gpus)


def curve(arrived_pct: FloatArray, allocated_pct: FloatArray,
          step: float = CURVE_STEP_PCT) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Allocation % at the first pod whose arrived demand reaches each ``step`` %."""
    grid = np.arange(0.0, float(arrived_pct[-1]) + 1e-9, step)
    first = np.searchsorted(arrived_pct, grid - 1e-9, side="left")
    keep = first < arrived_pct.size
    return (tuple(round(float(x), 4) for x in grid[keep]),
            tuple(round(float(y), 4) for y in allocated_pct[first[keep]]))
