"""Who may be chosen: a ``Candidate`` (a running pod gpupool may evict, with what goes
with it) and the predicates that scope a choice (``below``, ``in_tenant``, ``in_group``,
combined by ``all_of`` and ``any_of``). See ``victims`` for the chooser."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpupool.core.allocation import Allocation
from gpupool.core.quota import Charge


@dataclass(frozen=True, slots=True)
class Candidate:
    """A running pod that may be evicted, and what goes with it."""

    allocation: Allocation
    priority: int = 0
    charge: Charge | None = None
    budgets: tuple[str, ...] = ()
    leaving: bool = False
    started_s: float = 0.0  # when it started (any clock); the younger goes first at a tie
    gang: str = ""  # the gang it is a member of: a victim only with all of it (``victims_gang``)

    @property
    def key(self) -> str:
        return self.allocation.key


Eligible = Callable[[Candidate], bool]


def below(priority: int) -> Eligible:
    """Pods of strictly lower priority (what a pod of ``priority`` may preempt)."""
    return lambda c: c.priority < priority


def in_tenant(tenant: str) -> Eligible:
    return lambda c: c.charge is not None and c.charge.tenant == tenant


def in_group(group: str) -> Eligible:
    return lambda c: c.charge is not None and c.charge.group == group


def all_of(*predicates: Eligible) -> Eligible:
    return lambda c: all(p(c) for p in predicates)


def any_of(*predicates: Eligible) -> Eligible:
    return lambda c: any(p(c) for p in predicates)
