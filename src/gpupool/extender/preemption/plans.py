"""The values of a preemption: its settings, the plan of one (the node, the pod's room,
whom to evict) and its victims (``preemptor`` makes and carries them out)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from gpupool.core.allocation import Allocation
from gpupool.core.request import PodRequest
from gpupool.core.victims import Limits


@dataclass(frozen=True, slots=True)
class PreemptionSettings:
    """``hold_s``: how long freed room stays the pod's; ``retry_s``: how long a pod whose
    preemption found nothing or failed waits before planning again."""

    enabled: bool = True
    hold_s: float = 120.0
    retry_s: float = 10.0
    attempts: int = 5
    instance: str = ""  # who reports the Events (the extender's pod name)
    limits: Limits = field(default_factory=Limits)


@dataclass(frozen=True, slots=True)
class Victim:
    uid: str
    namespace: str
    name: str
    priority: int

    def describe(self) -> str:
        return f"{self.namespace}/{self.name} (priority {self.priority})"


@dataclass(frozen=True, slots=True)
class Plan:
    """Room to make for one pod: the node, what the pod will hold there, whom to evict."""

    uid: str
    namespace: str
    name: str
    priority: int
    node: str
    hold: Allocation
    victims: tuple[Victim, ...]
    leaving: tuple[str, ...]  # uids of pods being deleted whose room the plan counts on
    request: PodRequest
    group: str | None
    written: bool = False  # the hold is in the ledger already (evictions to carry out)
    anywhere: bool = False  # victims may run on other nodes (a tenant quota's preemption)
    why: str = ""  # what the evictions are for, when not plain priority preemption

    @property
    def displaces(self) -> tuple[str, ...]:
        """Whom the hold stands for: the victims and the leaving pods it counts on."""
        return tuple(v.uid for v in self.victims) + self.leaving

    def note(self) -> str:
        if self.why:
            return f"making room here: {self.why}"
        who = "pods that are leaving" if not self.victims else \
            f"{len(self.victims)} pod{'s' if len(self.victims) > 1 else ''} of lower priority"
        return f"making room here: preempting {who} for this pod"


def stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
