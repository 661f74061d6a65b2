"""Learning the target workload online, as the extender does (``gpupool simulate --learn``).

By default every policy of a run is handed the target workload of the whole
trace up front (``Campaign.config``): it knows the future. The extender does
not: it starts with the built-in workload and re-derives one from what it has
seen every ``--workload-every`` seconds (``gpupool.core.policies.observed``).
``Learner`` replays that: the policy starts from ``BUILTIN_WORKLOAD``; every
arrival is remembered as a filter call would be (the last
``REMEMBERED_REQUESTS``, as the extender keeps); and every ``every`` units of
the run's clock the policy is rebuilt on ``observed_workload`` (the allocations
held plus the remembered pods). The clock is the arrival count in protocol mode
(which has no time; 600 arrivals stand for the extender's 600 s at one pod a
second) and seconds in timed mode.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from gpupool.core.errors import InvalidInput
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.policies.observed import BUILTIN_WORKLOAD, ShapeMemo, observed_workload
from gpupool.core.request import PodRequest
from gpupool.core.state import ClusterState

LEARN_EVERY = 600.0
"""The extender's default ``--workload-every`` (seconds; arrivals in protocol mode)."""
REMEMBERED_REQUESTS = 4096
"""Pods the extender remembers from its filter calls (its ``REMEMBERED_REQUESTS``)."""


@dataclass(slots=True)
class Learner:
    """When to re-derive the workload, and the pods seen since the start."""

    every: float
    weights: dict[str, float]
    recent: deque[PodRequest] = field(default_factory=lambda: deque(maxlen=REMEMBERED_REQUESTS))
    next_at: float | None = None
    refreshes: int = 0
    note: str = "built-in"
    memo: ShapeMemo = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.every > 0:
            raise InvalidInput(f"the learning interval must be > 0 (got {self.every})")

    def start(self) -> PolicyConfig:
        """What the policy starts with: the built-in workload (an empty cluster)."""
        return PolicyConfig(BUILTIN_WORKLOAD, dict(self.weights))

    def arrived(self, request: PodRequest, now: float, state: ClusterState
                ) -> PolicyConfig | None:
        """Remember ``request``; a new config when a refresh is due at ``now``."""
        self.recent.append(request)
        if self.next_at is None:
            self.next_at = now + self.every
        if now < self.next_at:
            return None
        self.next_at = now + self.every
        self.refreshes += 1
        workload, self.note = observed_workload(state, self.recent, self.memo)
        return PolicyConfig(workload, dict(self.weights))
