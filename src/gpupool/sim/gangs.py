"""Replaying gangs: placed whole by ``core.gang`` against placed pod by pod (docs/gangs.md).

One run replays a generated workload (``sim.gangload``) in one of two modes:

* ``gang``: a job (a gang, or a single pod) is placed whole when it arrives, or waits
  whole in the queue (``core.gang.place_gang``, all members or none);
* ``per-pod``: every member is a pod of its own, placed when it arrives or queued (what a
  scheduler without gangs does); a gang starts when its last member is placed, and until
  then its placed members hold GPUs that do nothing (*partial*).

Both modes serve the queue the same way: at every event, in arrival order, each waiting
entry is tried at most once per release of resources (a placement can only make room
smaller, so an entry that failed is tried again only after something left), at most
``tries`` jobs per event (the members of a gang placed pod by pod count as one). A job
runs ``duration_s`` from its start. The run ends when the queue and the cluster are
empty, or at ``horizon_s`` after the last arrival (members of partial gangs may hold
GPUs for ever: two partial gangs can wait on each other).

Measured: time-weighted unallocated GPU share while something waits (to the end of the
run), the share held by partial gangs and the allocated share (means from the first
arrival to the last, as ``sim.timed`` takes them: the drain is left out), gang wait
times (start − arrival),
jobs never started, partial gangs, and bursts granted, refused and reclaimed
(``sim.bursts``).
"""

from __future__ import annotations

import dataclasses
import heapq
import random
import time
from dataclasses import dataclass
from enum import Enum

import numpy as np

from gpupool.core.allocation import Allocation
from gpupool.core.gang import Gang, place_gang, reserve_gang
from gpupool.core.placement import Placer
from gpupool.core.scoring import Policy
from gpupool.core.state import ClusterState
from gpupool.sim.bursts import BurstBook
from gpupool.sim.gangload import Job
from gpupool.sim.scenario import demand_milli

TRIES = 32
HORIZON_S = 24 * 3600.0
FINISH, ARRIVE = 0, 1


class Mode(Enum):
    GANG = "gang"
    PER_POD = "per-pod"


@dataclass(frozen=True, slots=True)
class GangRun:
    """Outcome of one (mode, policy, seed) replay."""

    mode: str
    policy: str
    seed: int
    jobs: int
    gangs: int
    started: int
    never_started: int
    gangs_never_started: int
    partial_gangs: int  # gangs that held GPUs before they could start
    partial_gpu_hours: float  # GPU share × hours held by partial gangs
    unallocated_waiting_pct: float  # mean unallocated GPU share while something waits
    idle_waiting_pct: float  # the same plus what partial gangs hold (GPUs doing nothing)
    partial_held_pct: float  # mean GPU share held by partial gangs
    allocated_pct: float  # mean allocated GPU share (means: over the arrivals)
    gang_wait_median_s: float
    gang_wait_p90_s: float
    gang_wait_max_s: float
    bursts_granted: int
    bursts_refused: int
    bursts_reclaimed: int
    wall_s: float

    def summary(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def replay(nodes: ClusterState, jobs: tuple[Job, ...], mode: Mode, policy: Policy,
           policy_name: str, seed: int, tries: int = TRIES, horizon_s: float = HORIZON_S
           ) -> GangRun:
    """Replay ``jobs`` on a copy of ``nodes`` (see the module)."""
    started = time.perf_counter()
    run = _Run(nodes.snapshot().state(), jobs, mode, policy, random.Random(seed), tries)
    run.loop(horizon_s)
    return run.result(policy_name, seed, time.perf_counter() - started)


class _Run:
    """One replay's state; ``loop`` is the event loop."""

    def __init__(self, state: ClusterState, jobs: tuple[Job, ...], mode: Mode, policy: Policy,
                 rng: random.Random, tries: int):
        self.state, self.jobs, self.mode, self.policy = state, jobs, mode, policy
        self.rng, self.tries = rng, tries
        self.placer = Placer(policy)
        self.bursts = BurstBook(state)
        self.capacity = state.usage().capacity_milli
        self.events: list[tuple[float, int, int]] = [(j.arrival_s, ARRIVE, k)
                                                      for k, j in enumerate(jobs)]
        heapq.heapify(self.events)
        self.queue: dict[tuple[int, int], int] = {}  # (job, member or -1) -> release seen
        self.releases = 0
        self.placed: dict[int, list[Allocation]] = {}
        self.start_s: dict[int, float] = {}
        self.partial_since: dict[int, float] = {}
        self.partial_milli: dict[int, int] = {}
        self.partial_ever: set[int] = set()
        self.partial_gpu_s = 0.0
        self.samples: list[tuple[float, int, int, bool]] = []  # time, allocated, partial, waits

    def loop(self, horizon_s: float) -> None:
        end = (self.jobs[-1].arrival_s if self.jobs else 0.0) + horizon_s
        now = 0.0
        while self.events and self.events[0][0] <= end:
            now, kind, k = heapq.heappop(self.events)
            if kind == ARRIVE:
                self._arrive(k)
            else:
                self._finish(k)
            self._serve(now)
            self._sample(now)
        self._close(end if self.queue else now)  # what still waits, waits to the horizon

    # -- events --------------------------------------------------------------------------
    def _arrive(self, k: int) -> None:
        job = self.jobs[k]
        if self.mode is Mode.GANG or not job.is_gang:
            self.queue[(k, -1)] = -1
        else:
            for i in range(len(job.members)):
                self.queue[(k, i)] = -1

    def _finish(self, k: int) -> None:
        for alloc in self.placed.pop(k, []):
            self.state.release(alloc.key)
            self.bursts.released(alloc.key)
        self.releases += 1

    def _serve(self, now: float) -> None:
        tried: set[int] = set()  # jobs (a per-pod gang's members count as one)
        for entry, seen in list(self.queue.items()):
            if seen == self.releases:
                continue  # nothing left since it last failed: it would fail again
            if entry[0] not in tried and len(tried) == self.tries:
                break
            tried.add(entry[0])
            if self._place(entry, now):
                del self.queue[entry]
            else:
                self.queue[entry] = self.releases

    def _place(self, entry: tuple[int, int], now: float) -> bool:
        k, i = entry
        job = self.jobs[k]
        if i < 0 and job.is_gang:
            found = place_gang(self.state, Gang(job.name, job.members), self.policy, self.rng)
            if not found.ok:
                return False
            reserve_gang(self.state, found)
            allocs = list(found.allocations)
        else:
            decided = self.placer.decide(self.state, job.members[max(i, 0)], self.rng)
            if decided.allocation is None:
                return False
            self.state.reserve(decided.allocation)
            allocs = [decided.allocation]
        for alloc in allocs:
            self.bursts.placed(alloc, now)
        self._held(k, allocs, now)
        return True

    def _held(self, k: int, allocs: list[Allocation], now: float) -> None:
        job = self.jobs[k]
        mine = self.placed.setdefault(k, [])
        mine.extend(allocs)
        if len(mine) == len(job.members):
            self._partial_ends(k, now)
            self.start_s[k] = now
            heapq.heappush(self.events, (now + job.duration_s, FINISH, k))
            return
        self._partial_ends(k, now)  # what it held so far, counted up to now
        self.partial_since[k] = now
        self.partial_milli[k] = demand_milli(job.members[0]) * len(mine)  # members alike

    def _partial_ends(self, k: int, now: float) -> None:
        since = self.partial_since.pop(k, None)
        if since is not None:
            self.partial_gpu_s += (now - since) * self.partial_milli.pop(k) / 1000

    def _sample(self, now: float) -> None:
        self.partial_ever.update(self.partial_since)  # partial once an event is served
        allocated = self.state.usage().allocated_milli
        self.samples.append((now, allocated, sum(self.partial_milli.values()),
                             bool(self.queue)))

    def _close(self, end: float) -> None:
        for k in list(self.partial_since):
            self._partial_ends(k, end)
        if self.samples and end > self.samples[-1][0]:
            self.samples.append((end, *self.samples[-1][1:]))

    # -- the outcome ------------------------------------------------------------------------
    def result(self, policy: str, seed: int, wall_s: float) -> GangRun:
        gangs = [k for k, j in enumerate(self.jobs) if j.is_gang]
        waits = np.asarray([self.start_s[k] - self.jobs[k].arrival_s for k in gangs
                            if k in self.start_s] or [0.0])
        t = np.asarray([s[0] for s in self.samples] or [0.0])
        last = self.jobs[-1].arrival_s if self.jobs else 0.0  # the drain after is left out
        ends = np.append(t[1:], t[-1])
        spans = np.clip(np.minimum(ends, last) - t, 0.0, None)
        waited_spans = ends - t  # waiting is measured to the end, drain included
        alloc = np.asarray([s[1] for s in self.samples] or [0]) * 100 / self.capacity
        partial = np.asarray([s[2] for s in self.samples] or [0]) * 100 / self.capacity
        waiting = np.asarray([s[3] for s in self.samples] or [False])
        total, waited = float(spans.sum()) or 1.0, float(waited_spans[waiting].sum()) or 1.0
        return GangRun(
            self.mode.value, policy, seed, len(self.jobs), len(gangs), len(self.start_s),
            len(self.jobs) - len(self.start_s), sum(k not in self.start_s for k in gangs),
            len(self.partial_ever), round(self.partial_gpu_s / 3600, 3),
            round(float(((100 - alloc) * waited_spans)[waiting].sum()) / waited, 2),
            round(float(((100 - alloc + partial) * waited_spans)[waiting].sum()) / waited, 2),
            round(float((partial * spans).sum()) / total, 2),
            round(float((alloc * spans).sum()) / total, 2),
            round(float(np.median(waits)), 1), round(float(np.percentile(waits, 90)), 1),
            round(float(waits.max()), 1), self.bursts.granted, self.bursts.refused,
            self.bursts.reclaimed, round(wall_s, 2))
