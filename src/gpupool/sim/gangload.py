"""A generated workload of gangs and single pods, some of them burstable (seeded).

The Alibaba trace names pods, not jobs (docs/simulator.md), so gangs are generated:

* **jobs**: ``jobs`` of them; a share ``gang_share`` are gangs, the rest single pods;
* **a gang** has ``size`` members drawn from ``sizes`` (2–64 by default, small ones more
  often); its members are whole GPUs (share ``whole_share``) or slices of 4 or 8 GiB and
  25 or 50 % of a GPU, all members of a gang alike (as the workers of one training job);
* **a single pod** is a slice (2–8 GiB, 10–50 %) or one or two whole GPUs, half each; a
  share ``burst_share`` of the slices is burstable, its memory limit 4 or 8 GiB above its
  request (``GpuDemand.memory_limit_mib``);
* **durations** are exponential with mean ``mean_duration_s``; **arrivals** a Poisson
  process whose rate makes the offered GPU demand (GPU share × duration, summed) ``load``
  times the cluster's GPUs over the arrival period.

Everything comes from one ``random.Random(seed)``; the same mix and seed give the same jobs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from gpupool.core.errors import InvalidInput
from gpupool.core.request import GpuDemand, Mode, PodRequest
from gpupool.sim.scenario import demand_milli

SIZES = ((2, 30), (4, 25), (8, 20), (16, 12), (32, 8), (64, 5))
"""Gang sizes and their weights."""
SLICE_GIB, SLICE_PCT = (4, 8), (25, 50)
SINGLE_GIB, SINGLE_PCT, BURST_GIB = (2, 4, 8), (10, 25, 50), (4, 8)


@dataclass(frozen=True, slots=True)
class GangMix:
    """The knobs of the generated workload (policy as data)."""

    jobs: int = 2000
    gang_share: float = 0.4
    whole_share: float = 0.5
    burst_share: float = 0.3
    sizes: tuple[tuple[int, int], ...] = SIZES
    load: float = 1.1
    mean_duration_s: float = 3600.0

    def __post_init__(self) -> None:
        shares = (self.gang_share, self.whole_share, self.burst_share)
        if self.jobs < 1 or not all(0 <= s <= 1 for s in shares):
            raise InvalidInput("a gang mix needs jobs >= 1 and shares in 0..1")
        if self.load <= 0 or self.mean_duration_s <= 0:
            raise InvalidInput("a gang mix needs a positive load and mean duration")
        if not self.sizes or any(not 2 <= n <= 64 or w <= 0 for n, w in self.sizes):
            raise InvalidInput("gang sizes must be 2..64 with positive weights")


@dataclass(frozen=True, slots=True)
class Job:
    """A gang (several members) or a single pod (one), arriving at ``arrival_s``."""

    name: str
    arrival_s: float
    duration_s: float
    members: tuple[PodRequest, ...]

    @property
    def is_gang(self) -> bool:
        return len(self.members) > 1

    @property
    def demand_milli(self) -> int:
        return sum(demand_milli(m) for m in self.members)


def generate(mix: GangMix, gpus: int, seed: int) -> tuple[Job, ...]:
    """``mix.jobs`` jobs for a cluster of ``gpus`` GPUs (see the module)."""
    if gpus <= 0:
        raise InvalidInput("the cluster has no GPU")
    rng = random.Random(seed)
    drafts = [_draft(mix, rng, k) for k in range(mix.jobs)]
    work = sum(sum(demand_milli(m) for m in members) * d for _, d, members in drafts)
    span_s = work / (mix.load * gpus * 1000)  # the arrival period that offers ``load``
    rate = mix.jobs / span_s
    t, jobs = 0.0, []
    for name, duration, members in drafts:
        jobs.append(Job(name, t, duration, members))
        t += rng.expovariate(rate)
    return tuple(jobs)


def _draft(mix: GangMix, rng: random.Random, k: int
           ) -> tuple[str, float, tuple[PodRequest, ...]]:
    duration = rng.expovariate(1 / mix.mean_duration_s)
    if rng.random() < mix.gang_share:
        size = rng.choices([n for n, _ in mix.sizes], [w for _, w in mix.sizes])[0]
        demand = GpuDemand(1, mode=Mode.EXCLUSIVE) if rng.random() < mix.whole_share else \
            GpuDemand(1, rng.choice(SLICE_GIB) * 1024, rng.choice(SLICE_PCT))
        name = f"gang-{k:05d}"
        return name, duration, tuple(PodRequest(f"{name}-{i}", 2000, 8192, (demand,))
                                     for i in range(size))
    name = f"pod-{k:05d}"
    if rng.random() < 0.5:
        demand = GpuDemand(rng.choice((1, 2)), mode=Mode.EXCLUSIVE)
    else:
        mib = rng.choice(SINGLE_GIB) * 1024
        limit = mib + rng.choice(BURST_GIB) * 1024 if rng.random() < mix.burst_share else 0
        demand = GpuDemand(1, mib, rng.choice(SINGLE_PCT), memory_limit_mib=limit)
    return name, duration, (PodRequest(name, 1000, 4096, (demand,)),)
