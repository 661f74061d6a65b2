"""Over-users: containers that use more of a GPU than their slice, for longer than a grace.

Pure and deterministic: ``OveruseTracker.update`` takes one sample's per-container
usage (``Observation``) and the time, and returns what changed. A container is *over*
on a GPU when

* its processes hold more memory than its slice plus ``memory_tolerance_mib``, or
* the mean SM utilisation of its processes over the last ``compute_window_s`` exceeds
  its compute share plus ``compute_tolerance_pct``

(the slice's *limits*: a burstable slice's are above its request until the burst is
reclaimed, ``nodeagent.burst``);

and an *over-user* once it has been over at every sample for ``grace_s``. A process on
a GPU in a pod that holds no slice of that GPU is over with a slice of zero. Whole-GPU
(exclusive) slices cannot be exceeded. An over-user stops being one at the first sample
that finds it within its slice (or gone). GPUs whose sample failed are ``skipped``: the
containers on them keep their state until a sample succeeds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class OveruseConfig:
    grace_s: float = 30.0
    compute_window_s: float = 60.0
    memory_tolerance_mib: int = 0
    compute_tolerance_pct: int = 10


@dataclass(frozen=True, slots=True)
class Observation:
    """What one container used of one GPU in one sample, and its slice of it."""

    pod_uid: str
    pod_ref: str
    container: str
    gpu_uuid: str
    memory_mib: int
    sm_pct: int | None
    memory_limit_mib: int
    core_limit_pct: int
    exclusive: bool = False
    burst_memory_mib: int = 0  # how much of the limits is burst, above the request
    burst_core_pct: int = 0  # (a burstable slice; ``nodeagent.burst``)
    pids: tuple[int, ...] = ()  # its processes on the GPU (the ``pause`` action's handle)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.pod_uid, self.container, self.gpu_uuid)

    @property
    def memory_request_mib(self) -> int:
        return self.memory_limit_mib - self.burst_memory_mib

    @property
    def core_request_pct(self) -> int:
        return self.core_limit_pct - self.burst_core_pct


@dataclass(frozen=True, slots=True)
class OverUse:
    """An over-user, with the figures that make it one."""

    seen: Observation
    compute_pct: int | None  # the window's mean, None without samples
    since: float

    def sentence(self) -> str:
        s = self.seen
        parts = []
        if s.memory_mib > s.memory_limit_mib and not s.exclusive:
            parts.append(f"{s.memory_mib} MiB of GPU memory (slice {s.memory_limit_mib} MiB)")
        if self.compute_pct is not None and self.compute_pct > s.core_limit_pct:
            parts.append(f"{self.compute_pct} % of the GPU's compute (slice "
                         f"{s.core_limit_pct} %)")
        what = " and ".join(parts) or "more than its slice"
        return f"pod {s.pod_ref} container {s.container} uses {what} on GPU {s.gpu_uuid}"


@dataclass(frozen=True, slots=True)
class Changes:
    started: tuple[OverUse, ...] = ()  # became over-users at this sample
    ended: tuple[OverUse, ...] = ()  # were over-users, are not any more
    current: tuple[OverUse, ...] = ()  # every over-user now (including ``started``)


@dataclass
class _Track:
    over_since: float | None = None
    flagged: OverUse | None = None
    window: deque[tuple[float, int]] = field(default_factory=deque)


class OveruseTracker:
    """Per-container state across samples."""

    def __init__(self, config: OveruseConfig):
        self.config = config
        self._tracks: dict[tuple[str, str, str], _Track] = {}

    def update(self, now: float, seen: Iterable[Observation],
               skipped: frozenset[str] = frozenset()) -> Changes:
        started, ended = [], []
        present = {}
        for obs in seen:
            present[obs.key] = obs
            track = self._tracks.setdefault(obs.key, _Track())
            verdict = self._judge(now, obs, track)
            if verdict == "started":
                assert track.flagged is not None
                started.append(track.flagged)
            elif verdict == "ended":
                ended.append(self._end(track))
        for key in [k for k in self._tracks if k not in present and k[2] not in skipped]:
            track = self._tracks.pop(key)
            if track.flagged is not None:
                ended.append(self._end(track))
        current = tuple(t.flagged for t in self._tracks.values() if t.flagged is not None)
        return Changes(tuple(started), tuple(ended), current)

    def _judge(self, now: float, obs: Observation, track: _Track) -> str:
        compute = self._compute(now, obs, track)
        if not self._over(obs, compute):
            track.over_since = None
            return "ended" if track.flagged is not None else ""
        if track.over_since is None:
            track.over_since = now
        if track.flagged is not None:
            track.flagged = OverUse(obs, compute, track.flagged.since)
            return ""
        if now - track.over_since >= self.config.grace_s:
            track.flagged = OverUse(obs, compute, track.over_since)
            return "started"
        return ""

    def _compute(self, now: float, obs: Observation, track: _Track) -> int | None:
        if obs.sm_pct is not None:
            track.window.append((now, obs.sm_pct))
        while track.window and track.window[0][0] < now - self.config.compute_window_s:
            track.window.popleft()
        if not track.window:
            return None
        return round(sum(v for _, v in track.window) / len(track.window))

    def _over(self, obs: Observation, compute: int | None) -> bool:
        if obs.exclusive:
            return False
        memory = obs.memory_mib > obs.memory_limit_mib + self.config.memory_tolerance_mib
        busy = compute is not None and \
            compute > obs.core_limit_pct + self.config.compute_tolerance_pct
        return memory or busy

    @staticmethod
    def _end(track: _Track) -> OverUse:
        flagged, track.flagged, track.over_since = track.flagged, None, None
        assert flagged is not None
        return flagged
