"""Cohort members and what they use, as values: nominal quotas, borrowing and lending limits,
weights, and the per-dimension arithmetic of a cohort's pool (see ``core.cohort``).

A member's *lendable* part of a dimension is ``min(lending limit, nominal)`` (0 without a
cohort), its *guaranteed* part the rest; the cohort's *pool* is the sum of its members'
lendable parts, and a member using ``u`` draws ``max(0, u − guaranteed)`` from it. A None
dimension of the nominal is not counted: unlimited there, it neither lends nor borrows.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from math import isfinite

from gpupool.core.errors import InvalidInput, UnknownName
from gpupool.core.quota import Amount, Limit, QuotaBook
from gpupool.core.victims import Candidate

DIMS = tuple(f.name for f in fields(Amount))
UNITS = {"gpus": "GPUs", "memory_mib": "MiB of GPU memory", "core_pct": "% of GPU compute"}

MemberOf = Callable[[Candidate], "str | None"]


def by_group(c: Candidate) -> str | None:
    """The member a pod is charged to: its charge's group (the default)."""
    return None if c.charge is None else c.charge.group


def by_tenant(c: Candidate) -> str | None:
    """The member a pod is charged to: its charge's tenant."""
    return None if c.charge is None else c.charge.tenant


@dataclass(frozen=True, slots=True)
class CohortMember:
    """A nominal quota, the cohort it lends to and borrows from, its limits and weight."""

    name: str
    nominal: Limit
    cohort: str | None = None
    borrowing_limit: Limit | None = None
    lending_limit: Limit | None = None
    weight: float = 1

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidInput("a cohort member needs a name")
        if not (isfinite(self.weight) and self.weight >= 0):
            raise InvalidInput(f"{self.name}: weight must be a number >= 0, got {self.weight}")

    def nominal_of(self, dim: str) -> int | None:
        value: int | None = getattr(self.nominal, dim)
        return value

    def lendable(self, dim: str) -> int:
        """How much of the nominal the cohort may use (0 without a cohort)."""
        n = self.nominal_of(dim)
        if n is None or self.cohort is None:
            return 0
        cap = None if self.lending_limit is None else getattr(self.lending_limit, dim)
        return n if cap is None else min(cap, n)

    def guaranteed(self, dim: str) -> int:
        return (self.nominal_of(dim) or 0) - self.lendable(dim)

    def may_borrow(self, dim: str) -> int | None:
        """How far beyond the nominal it may go (None: no limit)."""
        if self.cohort is None:
            return 0
        return None if self.borrowing_limit is None else getattr(self.borrowing_limit, dim)


@dataclass(frozen=True, slots=True)
class CohortState:
    """The members (by name) and what each uses now. Values: ``charged`` and ``refunded``
    return new states."""

    members: Mapping[str, CohortMember]
    used: Mapping[str, Amount] = field(default_factory=dict)

    @staticmethod
    def of(members: Iterable[CohortMember], used: Mapping[str, Amount] | None = None
           ) -> CohortState:
        table: dict[str, CohortMember] = {}
        for m in members:
            if m.name in table:
                raise InvalidInput(f"cohort member {m.name} is defined twice")
            table[m.name] = m
        return CohortState(table, dict(used or {}))

    @staticmethod
    def from_book(members: Iterable[CohortMember], book: QuotaBook) -> CohortState:
        """Members charged as groups in ``book`` (``used_by_group``)."""
        listed = list(members)
        return CohortState.of(listed, {m.name: book.used_by_group(m.name) for m in listed})

    def member(self, name: str) -> CohortMember:
        try:
            return self.members[name]
        except KeyError:
            known = ", ".join(sorted(self.members)) or "none"
            raise UnknownName(f"{name} has no quota in any cohort (known: {known})") from None

    def used_by(self, name: str) -> Amount:
        return self.used.get(name, Amount())

    def peers(self, name: str) -> list[CohortMember]:
        """The members of ``name``'s cohort, itself included (only itself: no cohort)."""
        cohort = self.member(name).cohort
        if cohort is None:
            return [self.member(name)]
        return [m for n, m in sorted(self.members.items()) if m.cohort == cohort]

    def charged(self, name: str, amount: Amount) -> CohortState:
        return CohortState(self.members, {**self.used, name: self.used_by(name) + amount})

    def refunded(self, name: str, amount: Amount) -> CohortState:
        used = self.used_by(name)
        left = Amount(*(max(getattr(used, d) - getattr(amount, d), 0) for d in DIMS))
        return CohortState(self.members, {**self.used, name: left})

    # -- per dimension ----------------------------------------------------------------------
    def borrowed(self, name: str) -> Amount:
        """How far beyond its nominal the member runs, per counted dimension."""
        m, u = self.member(name), self.used_by(name)
        return Amount(*(over(getattr(u, d), m.nominal_of(d)) for d in DIMS))

    def draw(self, name: str, dim: str, used: int | None = None) -> int:
        """What the member draws from its cohort's pool with usage ``used`` (now: None)."""
        m = self.member(name)
        if m.nominal_of(dim) is None or m.cohort is None:
            return 0
        u = getattr(self.used_by(name), dim) if used is None else used
        return max(0, u - m.guaranteed(dim))

    def pool(self, name: str, dim: str) -> tuple[int, int]:
        """(capacity, drawn) of the pool of ``name``'s cohort in ``dim``."""
        peers = self.peers(name)
        return (sum(p.lendable(dim) for p in peers), sum(self.draw(p.name, dim) for p in peers))

    def lendable_idle(self, name: str) -> Amount:
        """What of the member's nominal its cohort may still borrow: its lendable part
        that it does not use itself, per dimension."""
        m, u = self.member(name), self.used_by(name)
        return Amount(*(min(m.lendable(d), max(0, (m.nominal_of(d) or 0) - getattr(u, d)))
                        for d in DIMS))

    def borrowable(self, name: str) -> Amount:
        """What the members of ``name``'s cohort lend in all, borrowed or not: the sum of
        their ``lendable_idle``."""
        total = Amount()
        for p in self.peers(name):
            total = total + self.lendable_idle(p.name)
        return total


def over(used: int, nominal: int | None) -> int:
    return 0 if nominal is None else max(0, used - nominal)
