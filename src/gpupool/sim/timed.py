"""Timed replay: pods arrive at ``creation_s`` and leave at ``deletion_s``.

Events are replayed in time order; at equal times departures come first, then
arrivals (in workload order), then departures of pods that live zero seconds.
A pod that finds no node when it arrives is counted as failed and not retried
(the core has no queue; kube-scheduler would retry it). A pod without a
deletion time never leaves. The seed only drives the policy's generator (ties
and random choices); the order is the trace's.

On the Alibaba trace the literal timestamps barely load the cluster (at most
about 56 pods live at once, see docs/simulator.md), which is why the paper's
protocol (``gpupool.sim.protocol``) ignores them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpupool.core.errors import InvalidInput
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.state import ClusterState
from gpupool.sim.decision import Decider
from gpupool.sim.failure import FailureTally
from gpupool.sim.protocol import PROGRESS_EVERY, FloatArray, Progress, asks_no_gpu_memory
from gpupool.sim.scenario import Scenario, TracePod, demand_milli
from gpupool.sim.window import ALL_NODES

CURVE_POINTS = 1000
LEAVE, ARRIVE, LEAVE_AT_ONCE = 0, 1, 2


@dataclass(frozen=True, slots=True)
class TimedRun:
    """Outcome of one (policy, seed) timed replay."""

    policy: str
    seed: int
    pods: int
    failed_pods: int
    failures_by_kind: dict[str, int]
    failures_by_reason: dict[str, int]
    peak_allocation_pct: float
    peak_time_s: float
    mean_allocation_pct: float  # time-weighted, from the first to the last arrival
    peak_live_pods: int
    curve_time_s: tuple[float, ...]
    curve_allocated_pct: tuple[float, ...]
    wall_s: float
    decision_median_ms: float
    decision_p99_ms: float
    nodes_to_score: int = ALL_NODES  # kube-scheduler's percentageOfNodesToScore (0: adaptive)
    bounced_pods: int = 0  # placed only after kube-scheduler's first window was refused
    workload_refreshes: int = 0  # times the policy re-learned its workload (--learn)

    def summary(self) -> dict[str, object]:
        row = dataclasses.asdict(self)
        del row["curve_time_s"], row["curve_allocated_pct"]
        return row


def events(pods: Sequence[TracePod]) -> list[tuple[float, int, int]]:
    """(time, kind, pod index) in replay order."""
    out: list[tuple[float, int, int]] = []
    for k, pod in enumerate(pods):
        if pod.creation_s is None:
            raise InvalidInput(f"timed mode needs a creation time for every pod; "
                               f"{pod.request.key} has none")
        out.append((pod.creation_s, ARRIVE, k))
        if pod.deletion_s is not None:
            leave = LEAVE_AT_ONCE if pod.deletion_s == pod.creation_s else LEAVE
            out.append((pod.deletion_s, leave, k))
    out.sort()
    return out


def run_timed(scenario: Scenario, policy: str, seed: int, config: PolicyConfig,
              progress: Progress | None = None, nodes_to_score: int = ALL_NODES,
              learn_every: float | None = None) -> TimedRun:
    """Replay ``scenario`` with its creation and deletion times (``learn_every``: the
    policy learns its workload every that many seconds)."""
    replay = _Replay(scenario, policy, seed, config, nodes_to_score, learn_every)
    started = time.perf_counter()
    replay.run(events(scenario.pods), progress)
    return replay.result(time.perf_counter() - started)


class _Replay:
    """State of one timed replay; ``run`` is the hot loop."""

    def __init__(self, scenario: Scenario, policy: str, seed: int, config: PolicyConfig,
                 nodes_to_score: int = ALL_NODES, learn_every: float | None = None):
        self.scenario, self.policy, self.seed = scenario, policy, seed
        self.state = ClusterState(scenario.nodes)
        self.capacity = self.state.usage().capacity_milli
        if self.capacity <= 0:
            raise InvalidInput("the cluster has no GPU")
        self.decider = Decider(self.state, policy, config, seed, scenario.classes,
                               nodes_to_score, learn_every)
        self.tally = FailureTally(self.state)
        self.additive = all(asks_no_gpu_memory(p.request) for p in scenario.pods)
        self.times: list[float] = []
        self.allocated: list[int] = []
        self.live: dict[str, int] = {}
        self.peak_live = 0
        self.last_arrival = 0.0
        self.decision_s: list[float] = []

    def run(self, timeline: list[tuple[float, int, int]], progress: Progress | None) -> None:
        pods, now, arrived = self.scenario.pods, 0, 0
        for t, kind, k in timeline:
            request = pods[k].request
            if kind == ARRIVE:
                now += self.arrive(k, t)
                arrived += 1
                self.last_arrival = t
                if progress is not None and arrived % PROGRESS_EVERY == 0:
                    progress(PROGRESS_EVERY)
            elif request.key in self.live:
                self.state.release(request.key)
                self.tally.changed()
                now -= self.live.pop(request.key)
            if not self.additive:
                now = self.state.usage().allocated_milli
            self.times.append(t)
            self.allocated.append(now)
        if progress is not None:
            progress(arrived % PROGRESS_EVERY)

    def arrive(self, k: int, at: float) -> int:
        request = self.scenario.pods[k].request
        t0 = time.perf_counter()
        allocation = self.decider.decide(request, at)
        self.decision_s.append(time.perf_counter() - t0)
        if allocation is None:
            self.tally.record(k, request)
            return 0
        self.state.reserve(allocation)
        self.tally.changed()
        self.live[request.key] = demand_milli(request)
        self.peak_live = max(self.peak_live, len(self.live))
        return self.live[request.key]

    def result(self, wall_s: float) -> TimedRun:
        times = np.asarray(self.times, np.float64)
        pct = np.asarray(self.allocated, np.float64) * (100.0 / self.capacity)
        peak = int(np.argmax(pct)) if pct.size else 0
        xs, ys = time_curve(times, pct)
        decisions = np.asarray(self.decision_s or [0.0])
        return TimedRun(
            self.policy, self.seed, len(self.scenario.pods), self.tally.total,
            self.tally.by_kind(), self.tally.by_reason(),
            round(float(pct[peak]), 6) if pct.size else 0.0,
            float(times[peak]) if times.size else 0.0,
            round(time_mean(times, pct, self.last_arrival), 6),
            self.peak_live, xs, ys, round(wall_s, 4),
            round(float(np.median(decisions)) * 1e3, 4),
            round(float(np.percentile(decisions, 99)) * 1e3, 4),
            self.decider.window.percentage, self.decider.bounced,
            0 if self.decider.learner is None else self.decider.learner.refreshes)


def time_mean(times: FloatArray, pct: FloatArray, until: float) -> float:
    """Time-weighted mean of a step function (each value holds until the next event)
    from the first event to ``until`` (the last arrival: the drain afterwards is left out)."""
    if not times.size:
        return 0.0
    if until <= times[0]:
        return float(pct[0])
    ends = np.minimum(np.append(times[1:], until), until)
    spans = np.maximum(ends - times, 0.0)
    return float(np.sum(pct * spans) / (until - times[0]))


def time_curve(times: FloatArray, pct: FloatArray, points: int = CURVE_POINTS
               ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The step function sampled at ``points`` evenly spaced times."""
    if not times.size:
        return (), ()
    grid = np.linspace(times[0], times[-1], points) if times[-1] > times[0] else times[:1]
    at = np.searchsorted(times, grid, side="right") - 1
    return (tuple(round(float(x), 3) for x in grid), tuple(round(float(y), 4) for y in pct[at]))
