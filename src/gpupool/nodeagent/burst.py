"""Bursts: containers using more than their request, up to their limit, and their reclaim.

A burstable slice (docs/design/burst.md) has a *request* (what placement and quotas
counted) and a higher *limit* (what the isolation provider lets its processes use).
Pure and deterministic: ``BurstTracker.update`` takes one sample's observations (their
limits are the slices' limits), the GPUs' samples and their memory, and returns the
observations the over-use tracker is to judge plus what changed.

**A burst** is a container whose use is above its request: memory its processes hold
above ``memory_request_mib`` (+ ``memory_tolerance_mib``), or SM utilisation of this
sample above ``core_request_pct`` (+ ``compute_tolerance_pct``). It starts at the first
sample that finds it so (``granted``) and ends at the first that does not.

**The room a GPU's requests need**, per dimension, at every sample:

* memory: ``other + Σ max(used, request)`` over the containers holding a slice of the GPU
  (those not running yet count their whole request), where ``other`` is the memory NVML
  reports in use on the GPU that no container accounts for; *short* when above the GPU's
  memory;
* compute: ``Σ max(used, request)`` over the containers whose processes use the GPU's
  SMs at this sample (an idle slice needs no time); short when above 100 %.

**Reclaim.** While a GPU is short, its bursts are reclaimed most recent first (the burst
that started last; ties by pod, container), each counting its use above its request
against the shortfall, until the rest fits (both rules are ``core.burst``'s, which the
simulator applies too). A reclaimed burst's limit in that dimension is
its request again: the over-use tracker then judges it against its request, so after the
grace period the configured over-use action applies to it (``nodeagent.actions``). A
reclaim ends when the GPU is no longer short (the over-use then ends too).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from gpupool.core import burst as burst_rule
from gpupool.core.model import CORE_UNITS_PER_GPU
from gpupool.nodeagent.gpu import GpuUsage
from gpupool.nodeagent.overuse import Observation, OveruseConfig

Key = tuple[str, str, str]  # (pod uid, container, GPU uuid)


class Resource(StrEnum):
    MEMORY = "memory"
    COMPUTE = "compute"


@dataclass(frozen=True, slots=True)
class Burst:
    """A container above its request on a GPU, since ``since``."""

    seen: Observation
    since: float

    @property
    def memory_mib(self) -> int:
        """Memory held above the request."""
        return max(self.seen.memory_mib - self.seen.memory_request_mib, 0)

    @property
    def compute_pct(self) -> int:
        """SM utilisation above the request (this sample)."""
        return max((self.seen.sm_pct or 0) - self.seen.core_request_pct, 0)

    def above(self, resource: Resource) -> int:
        return self.memory_mib if resource is Resource.MEMORY else self.compute_pct

    def sentence(self) -> str:
        s = self.seen
        parts = []
        if self.memory_mib:
            parts.append(f"{s.memory_mib} MiB of GPU memory (request {s.memory_request_mib} "
                         f"MiB, limit {s.memory_limit_mib} MiB)")
        if self.compute_pct:
            parts.append(f"{s.sm_pct} % of the GPU's compute (request {s.core_request_pct} %, "
                         f"limit {s.core_limit_pct} %)")
        return (f"pod {s.pod_ref} container {s.container} bursts on GPU {s.gpu_uuid}: uses "
                f"{' and '.join(parts) or 'more than its request'}")


@dataclass(frozen=True, slots=True)
class Reclaim:
    """A burst taken back: ``resource`` on its GPU was ``short`` of what requests need."""

    burst: Burst
    resource: Resource
    short: int  # MiB or percent the GPU lacked before this reclaim

    def sentence(self) -> str:
        unit = "MiB of memory" if self.resource is Resource.MEMORY else "% of compute"
        s = self.burst.seen
        return (f"GPU {s.gpu_uuid} needs {self.short} {unit} more for its slices' requests: "
                f"the burst of pod {s.pod_ref} container {s.container} "
                f"({self.burst.above(self.resource)} {unit} above its request) is reclaimed")


@dataclass(frozen=True, slots=True)
class BurstChanges:
    granted: tuple[Burst, ...] = ()  # started at this sample
    reclaimed: tuple[Reclaim, ...] = ()  # reclaimed at this sample (not at the previous)
    current: tuple[Burst, ...] = ()  # every burst now
    held_back: frozenset[tuple[Key, Resource]] = frozenset()  # every reclaim in force now


class BurstTracker:
    """Burst start times and reclaims across samples."""

    def __init__(self, config: OveruseConfig):
        self.config = config
        self._since: dict[Key, float] = {}
        self._held_back: frozenset[tuple[Key, Resource]] = frozenset()

    def update(self, now: float, seen: Sequence[Observation], usage: Sequence[GpuUsage],
               memory_of: Mapping[str, int]) -> tuple[list[Observation], BurstChanges]:
        """The observations to judge (reclaimed limits cut to the request) and the changes.
        ``memory_of``: each GPU's memory in MiB (a GPU missing there is never short)."""
        bursts, granted = self._bursts(now, seen)
        reclaims: list[Reclaim] = []
        for gpu in usage:
            if gpu.error or gpu.uuid not in memory_of:
                continue
            mine = [o for o in seen if o.gpu_uuid == gpu.uuid]
            on_gpu = [b for b in bursts if b.seen.gpu_uuid == gpu.uuid]
            reclaims += _reclaim(on_gpu, Resource.MEMORY,
                                 memory_short(mine, gpu, memory_of[gpu.uuid]))
            reclaims += _reclaim(on_gpu, Resource.COMPUTE, compute_short(mine))
        held = frozenset((r.burst.seen.key, r.resource) for r in reclaims)
        fresh = tuple(r for r in reclaims if (r.burst.seen.key, r.resource) not in self._held_back)
        self._held_back = held
        judged = [_held_back(o, held) for o in seen]
        return judged, BurstChanges(granted, fresh, tuple(bursts), held)

    def _bursts(self, now: float, seen: Iterable[Observation]
                ) -> tuple[list[Burst], tuple[Burst, ...]]:
        bursts, granted = [], []
        since: dict[Key, float] = {}
        for o in seen:
            if not self._bursting(o):
                continue
            since[o.key] = self._since.get(o.key, now)
            burst = Burst(o, since[o.key])
            bursts.append(burst)
            if o.key not in self._since:
                granted.append(burst)
        self._since = since
        return bursts, tuple(granted)

    def _bursting(self, o: Observation) -> bool:
        if o.exclusive or not (o.burst_memory_mib or o.burst_core_pct):
            return False
        memory = o.memory_mib > o.memory_request_mib + self.config.memory_tolerance_mib
        compute = o.sm_pct is not None and \
            o.sm_pct > o.core_request_pct + self.config.compute_tolerance_pct
        return memory or compute


def memory_short(seen: Sequence[Observation], gpu: GpuUsage, memory_mib: int) -> int:
    """MiB the GPU lacks for every slice on it to reach its request (0: none)."""
    other = max(gpu.memory_used_mib - sum(o.memory_mib for o in seen), 0)
    return burst_rule.short(memory_mib, ((o.memory_mib, o.memory_request_mib)
                                         if not o.exclusive else (0, o.memory_limit_mib)
                                         for o in seen), other)


def compute_short(seen: Sequence[Observation]) -> int:
    """Percent of compute the GPU lacks for every busy slice on it to get its request."""
    return burst_rule.short(CORE_UNITS_PER_GPU, ((o.sm_pct or 0, o.core_request_pct)
                                                 for o in seen if o.sm_pct and not o.exclusive))


def _reclaim(bursts: Sequence[Burst], resource: Resource, short: int) -> list[Reclaim]:
    by_key = {b.seen.key: b for b in bursts}
    rule = [burst_rule.Bursting(k, b.since, b.above(resource)) for k, b in by_key.items()]
    return [Reclaim(by_key[r.key], resource, lacking)
            for r, lacking in burst_rule.reclaim(rule, short)]


def _held_back(o: Observation, held: frozenset[tuple[Key, Resource]]) -> Observation:
    """``o`` with its limit cut to its request in each reclaimed dimension."""
    if (o.key, Resource.MEMORY) in held:
        o = replace(o, memory_limit_mib=o.memory_request_mib, burst_memory_mib=0)
    if (o.key, Resource.COMPUTE) in held:
        o = replace(o, core_limit_pct=o.core_request_pct, burst_core_pct=0)
    return o
