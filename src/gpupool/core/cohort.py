"""Cohorts: quota members that borrow each other's idle capacity, lend within limits, share
what is idle by weight, and take lent capacity back.

A *member* (``CohortMember``) is whatever carries a nominal quota — a resource group or a
tenant; ``name`` is how pods are charged to it (``Candidate.charge.group`` by default, see
``member_of``). Per dimension of its ``nominal`` ``Limit`` (GPUs, MiB of GPU memory, % of
GPU compute; a None dimension is not counted: the member is unlimited there and neither
lends nor borrows it):

* ``lending_limit`` (None: all of it): how much of its nominal the cohort may use while
  the member does not. The rest, ``nominal − lending limit``, is *guaranteed*: only the
  member ever uses it.
* ``borrowing_limit`` (None: no limit): how far beyond its nominal it may go by borrowing.
  A member without a cohort never goes beyond its nominal.
* ``weight`` (>= 0): its share when idle capacity is divided (``fair_shares``).

The cohort's *pool* in a dimension is the sum of its members' lendable parts
(``min(lending limit, nominal)``); a member with usage ``u`` draws ``max(0, u − guaranteed)``
from it. An amount is admitted when the member stays within ``nominal + borrowing limit``
and the pool's draws stay within the pool (``admit``):

=========  ===================================================================
FITS       within the nominal, and the pool has room
BORROWS    beyond the nominal by ``borrows``, within the borrowing limit; the
           pool has room
RECLAIMS   within the nominal, but other members borrowed the room: ``reclaim``
           must be taken back from them first (``reclaim``)
REFUSED    over nominal + borrowing limit, or a borrow the full pool cannot give
=========  ===================================================================

Which pods are *borrowed*: a member's pods, oldest first, add up; a pod whose running
total passes the nominal in any counted dimension — and every younger pod — runs on
borrowed capacity (``borrowed_keys``). The youngest pods beyond the nominal are the
borrowed ones, so the pods that stay are those that have run longest.

``reclaim`` takes capacity back for a lender through ``victims.select`` (the one chooser of
whom to evict): only borrowed pods of the cohort's other members are eligible, and the
order is the victims' order — fewest pods, then lowest priorities, then youngest
(``Candidate.started_s``). ``fair_shares`` divides what the cohort can lend among members
that want to borrow, by weight: weighted max-min (water filling) in whole units, the
remainder unit by unit to the lowest ``(share + 1) / weight`` (the d'Hondt divisor rule),
which never gives a member less for a higher weight.

Pure and deterministic: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from fractions import Fraction

from gpupool.core.cohort_state import (
    DIMS,
    UNITS,
    CohortMember,
    CohortState,
    MemberOf,
    by_group,
    by_tenant,
    over,
)
from gpupool.core.errors import UnknownName
from gpupool.core.fairshare import weighted_max_min
from gpupool.core.quota import Amount
from gpupool.core.state import ClusterState
from gpupool.core.victims import Candidate, Limits, NoVictims, Quota, select

__all__ = [
    "DIMS", "Admission", "CohortMember", "CohortState", "MemberOf", "ReclaimPlan", "Verdict",
    "admit", "borrowed_keys", "by_group", "by_tenant", "dominant_share", "fair_shares",
    "reclaim", "shortfall", "weighted_max_min",
]

LIMITS = Limits()


# -- admission -----------------------------------------------------------------------------------
class Verdict(Enum):
    FITS = "fits"
    BORROWS = "borrows"
    RECLAIMS = "reclaims"
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class Admission:
    """Whether ``asked`` may be charged to ``member`` now, and how (see module).

    ``borrows``: the part beyond the nominal, taken from the cohort. ``reclaim``: what
    must be taken back from borrowing members first (RECLAIMS). ``reason``: a sentence
    naming the member, the cohort and the figures. ``permanent``: a refusal that holds
    whatever the others use (more than nominal + borrowing limit)."""

    verdict: Verdict
    member: str
    cohort: str | None
    asked: Amount
    borrows: Amount = field(default_factory=Amount)
    reclaim: Amount = field(default_factory=Amount)
    reason: str = ""
    permanent: bool = False

    @property
    def admitted(self) -> bool:
        """Whether the amount may be charged now, without taking anything back."""
        return self.verdict in (Verdict.FITS, Verdict.BORROWS)


def admit(state: CohortState, member: str, amount: Amount) -> Admission:
    """How ``amount`` more for ``member`` stands against its quota and its cohort."""
    m = state.member(member)
    borrows: dict[str, int] = {}
    reclaim: dict[str, int] = {}
    for dim in DIMS:
        refusal = _admit_dim(state, m, dim, getattr(amount, dim), borrows, reclaim)
        if refusal is not None:
            return Admission(Verdict.REFUSED, member, m.cohort, amount, reason=refusal[0],
                             permanent=refusal[1])
    got, back = Amount(**borrows), Amount(**reclaim)
    if back != Amount():
        return Admission(Verdict.RECLAIMS, member, m.cohort, amount, got, back,
                         _reclaim_reason(m, back))
    if got != Amount():
        return Admission(Verdict.BORROWS, member, m.cohort, amount, got, back,
                         f"{_who(m)} borrows {_describe(got)} from cohort {m.cohort}")
    return Admission(Verdict.FITS, member, m.cohort, amount, reason=f"fits the nominal "
                     f"quota of {_who(m, cohort=False)}")


def _admit_dim(state: CohortState, m: CohortMember, dim: str, asked: int,
               borrows: dict[str, int], reclaim: dict[str, int]) -> tuple[str, bool] | None:
    """Fill ``borrows`` and ``reclaim`` for ``dim``; (reason, permanent) on refusal."""
    n = m.nominal_of(dim)
    if asked <= 0 or n is None:
        return None
    u = getattr(state.used_by(m.name), dim)
    after, extra = u + asked, m.may_borrow(dim)
    if extra is not None and after > n + extra:
        return _over_limit(m, dim, asked, u, n, extra), asked > n + extra
    borrows[dim] = over(after, n) - over(u, n)
    if m.cohort is None:
        return None
    capacity, drawn = state.pool(m.name, dim)
    short = drawn - state.draw(m.name, dim) + state.draw(m.name, dim, after) - capacity
    if short <= 0:
        return None
    if after > n:
        return _pool_full(m, dim, asked, u, n, capacity, drawn), False
    reclaim[dim] = short
    return None


def _over_limit(m: CohortMember, dim: str, asked: int, used: int, nominal: int,
                extra: int) -> str:
    unit, left = UNITS[dim], max(nominal + extra - used, 0)
    if m.cohort is None:
        return (f"quota of {_who(m)} exceeded: {asked} {unit} asked, {used} of {nominal} in "
                f"use, {left} left")
    return (f"quota of {_who(m)} exceeded: {asked} {unit} asked, {used} in use, nominal "
            f"{nominal} + borrowing limit {extra}, {left} left")


def _pool_full(m: CohortMember, dim: str, asked: int, used: int, nominal: int,
               capacity: int, drawn: int) -> str:
    unit = UNITS[dim]
    return (f"{_who(m)} cannot borrow: {asked} {unit} asked, {used} of its nominal "
            f"{nominal} in use, and cohort {m.cohort} lends {capacity} in all, "
            f"{min(drawn, capacity)} in use, {max(capacity - drawn, 0)} left; it runs when "
            f"borrowed capacity comes back or others' pods end")


def _reclaim_reason(m: CohortMember, back: Amount) -> str:
    return (f"{_who(m)} is within its nominal quota, but cohort {m.cohort} lent that "
            f"capacity out: {_describe(back)} must be reclaimed from borrowing members")


def _who(m: CohortMember, cohort: bool = True) -> str:
    where = f" (cohort {m.cohort})" if cohort and m.cohort is not None else ""
    return f"{m.name}{where}"


def _describe(a: Amount) -> str:
    parts = [f"{getattr(a, d)} {UNITS[d]}" for d in DIMS if getattr(a, d)]
    return ", ".join(parts) or "nothing"


def shortfall(state: CohortState, member: str, amount: Amount) -> Amount:
    """How much of ``member``'s own usage must go for ``amount`` to be admitted (or to need
    only a reclaim), the others' usage unchanged: per dimension, what ``used + amount``
    passes ``max(nominal, min(nominal + borrowing limit, what the pool leaves it))``. More
    than it uses in some dimension: even evicting all its pods would not do. This is what
    a pod of higher priority takes back from its own member's pods of lower priority."""
    m, used = state.member(member), state.used_by(member)
    out = {}
    for dim in DIMS:
        n, asked = m.nominal_of(dim), getattr(amount, dim)
        if n is None or asked <= 0:
            out[dim] = 0
            continue
        extra, allowed = m.may_borrow(dim), n
        if m.cohort is not None:
            capacity, drawn = state.pool(member, dim)
            room = capacity - (drawn - state.draw(member, dim)) + m.guaranteed(dim)
            allowed = max(n, room if extra is None else min(n + extra, room))
        out[dim] = max(0, getattr(used, dim) + asked - allowed)
    return Amount(**out)


# -- borrowed pods and reclaim ---------------------------------------------------------------
def borrowed_keys(state: CohortState, pods: Iterable[Candidate],
                  member_of: MemberOf = by_group) -> frozenset[str]:
    """Keys of the pods that run on borrowed capacity: per member, oldest first
    (``started_s``, then key), every pod from the first whose running total passes the
    member's nominal in a counted dimension."""
    by_member: dict[str, list[Candidate]] = {}
    for c in pods:
        name = member_of(c)
        if name is not None and name in state.members and c.charge is not None:
            by_member.setdefault(name, []).append(c)
    out: set[str] = set()
    for name, mine in by_member.items():
        out.update(_beyond_nominal(state.member(name), mine))
    return frozenset(out)


def _beyond_nominal(m: CohortMember, pods: list[Candidate]) -> Iterator[str]:
    total, beyond = Amount(), False
    for c in sorted(pods, key=lambda c: (c.started_s, c.key)):
        assert c.charge is not None
        total = total + c.charge.amount
        beyond = beyond or any(over(getattr(total, d), m.nominal_of(d)) for d in DIMS)
        if beyond:
            yield c.key


@dataclass(frozen=True, slots=True)
class ReclaimPlan:
    """The borrowed pods to evict so ``lender`` gets ``need`` back (highest priority
    first), what their charges add up to, and whether it is enough (``restored``; if not,
    ``reason`` says why)."""

    lender: str
    cohort: str | None
    need: Amount
    victims: tuple[Candidate, ...]
    freed: Amount
    restored: bool
    reason: str

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(c.key for c in self.victims)


def reclaim(state: CohortState, lender: str, need: Amount, pods: Sequence[Candidate],
            cluster: ClusterState, member_of: MemberOf = by_group,
            budgets: Mapping[str, int] | None = None, limits: Limits = LIMITS) -> ReclaimPlan:
    """Borrowed pods of ``lender``'s cohort peers whose eviction gives back ``need`` (what
    ``admit`` said to reclaim), chosen by ``victims.select``. When a borrower's lending
    limit keeps part of its nominal guaranteed, its pods may give back less than they are
    charged; the selection is then repeated for what is still short."""
    m = state.member(lender)
    peers = {p.name for p in state.peers(lender)} - {lender}
    borrowed = borrowed_keys(state, pods, member_of)
    left = [c for c in pods if c.key in borrowed and member_of(c) in peers]
    chosen: list[Candidate] = []
    short, now = need, state
    while short != Amount():
        found = select(Quota(cluster, short), left, budgets=budgets, limits=limits)
        if isinstance(found, NoVictims):  # nobody is evicted for less than the need
            return _plan(m, need, [], False, f"the borrowed pods of cohort {m.cohort} "
                         f"cannot give back {_describe(short)}: {found.message}")
        now, short = _evicted(now, lender, short, found.victims, member_of)
        chosen.extend(found.victims)
        taken = set(found.keys)
        left = [c for c in left if c.key not in taken]
    return _plan(m, need, chosen, True, f"{len(chosen)} borrowed pods give {lender} back "
                 f"{_describe(need)}")


def _evicted(state: CohortState, lender: str, short: Amount, victims: Iterable[Candidate],
             member_of: MemberOf) -> tuple[CohortState, Amount]:
    """The state without ``victims`` and what is still short of the pool for ``lender``."""
    before = {d: state.pool(lender, d)[1] for d in DIMS}
    for c in victims:
        name = member_of(c)
        assert name is not None and c.charge is not None
        state = state.refunded(name, c.charge.amount)
    gained = {d: before[d] - state.pool(lender, d)[1] for d in DIMS}
    return state, Amount(*(max(getattr(short, d) - gained[d], 0) for d in DIMS))


def _plan(m: CohortMember, need: Amount, chosen: list[Candidate], restored: bool,
          reason: str) -> ReclaimPlan:
    freed = Amount()
    for c in chosen:
        assert c.charge is not None
        freed = freed + c.charge.amount
    ordered = tuple(sorted(chosen, key=lambda c: (-c.priority, -c.started_s, c.key)))
    return ReclaimPlan(m.name, m.cohort, need, ordered, freed, restored, reason)


# -- fair share ---------------------------------------------------------------------------------
def fair_shares(state: CohortState, cohort: str, wants: Mapping[str, Amount],
                lent: Amount | None = None) -> dict[str, Amount]:
    """How much each member of ``cohort`` that wants to borrow (``wants``: beyond its
    nominal, what it borrows now plus what waits) is entitled to borrow: what the cohort
    lends in all (``lent``; None: ``borrowable``), divided by weight in each counted
    dimension, capped by each member's want and borrowing limit. Never more in all than
    the cohort lends."""
    members = [m for m in state.members.values() if m.cohort == cohort]
    if not members:
        raise UnknownName(f"cohort {cohort} has no members")
    idle = state.borrowable(members[0].name) if lent is None else lent
    weights = {m.name: m.weight for m in members}
    out: dict[str, dict[str, int]] = {m.name: {} for m in members}
    for d in DIMS:
        capped = {m.name: _capped(m, d, getattr(wants.get(m.name, Amount()), d))
                  for m in members}
        for name, got in weighted_max_min(getattr(idle, d), capped, weights).items():
            out[name][d] = got
    return {name: Amount(**dims) for name, dims in out.items()}


def _capped(m: CohortMember, dim: str, want: int) -> int:
    if m.nominal_of(dim) is None:
        return 0
    limit = m.may_borrow(dim)
    return want if limit is None else min(want, limit)


def dominant_share(state: CohortState, name: str) -> Fraction:
    """The member's borrowed amount over what its cohort lends, in the dimension where
    that is largest, divided by its weight (a weight of 0 borrowing anything: above every
    other share). Lower is served first when idle capacity is handed out."""
    m, borrowed, idle = state.member(name), state.borrowed(name), state.borrowable(name)
    share = max((Fraction(getattr(borrowed, d), max(getattr(idle, d), 1)) for d in DIMS),
                default=Fraction(0))
    if m.weight > 0:
        return share / Fraction(m.weight)
    return share and Fraction(10**9) + share
