"""Fair share in a running cohort: may a member borrow this much more, given what the others
want?

A cohort *shares fairly* when one of its members asks for it. Then a member may borrow only
up to its weighted fair share of what the cohort lends (``cohort.fair_shares``, weighted
max-min), where each member's *want* is what it would borrow if it held what it holds now
plus everything of its that waits: ``borrowed(used + waiting)`` (the asking member's ask
included). What the cohort lends counts each member's waiting pods as taking their part of
its idle nominal back first (``lent``): borrowers get no share of capacity a lender's pods
are about to reclaim. A member nobody competes with gets everything it wants that the
cohort lends (work-conserving): the division only binds while others wait too.

Only the arithmetic of ``core.cohort`` is used; this module decides nothing else. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from math import inf

from gpupool.core.cohort import DIMS, CohortState, fair_shares
from gpupool.core.cohort_state import UNITS
from gpupool.core.quota import Amount, Limit


@dataclass(frozen=True, slots=True)
class FairShare:
    """A member's fair share against what it would borrow (``after``) in one dimension."""

    member: str
    cohort: str
    dim: str
    asked: int
    borrowed: int  # now, before the ask
    share: int
    weight: float
    weights: float  # of the members that want to borrow in this dimension

    def reason(self) -> str:
        """The refusal, in words kube-scheduler shows (whole numbers, no format verbs)."""
        return (f"fair share of {self.member} in cohort {self.cohort} reached: {self.asked} "
                f"{UNITS[self.dim]} asked, {self.borrowed} of {self.share} borrowed (weight "
                f"{_num(self.weight)} of {_num(self.weights)}), wait or raise the weight")


# asks of waiting pods remembered; beyond, the oldest ask of the namespace that has the most
# goes (one tenant's flood of pending pods drops only its own asks)
MAX_WAITING = 10_000


class WaitingAsks:
    """What pods waiting for a node ask, by pod key: noted when a pod is checked against a
    cohort that shares fairly, forgotten when ``still_waiting`` (the adapter's: is the pod
    still pending?) says it no longer waits."""

    def __init__(self, still_waiting: Callable[[str], bool] | None = None) -> None:
        self.asks: dict[str, tuple[str, Amount]] = {}
        self.still_waiting = still_waiting
        self.total = Amount()  # of every ask remembered (an upper bound of what waits)
        self.counts: dict[str, int] = {}  # asks remembered, by namespace

    def note(self, key: str, namespace: str | None, amount: Amount) -> None:
        old = self.asks.get(key)
        if old == (namespace or "", amount):
            return
        self.forget(key)
        self.asks[key] = (namespace or "", amount)
        self.total = self.total + amount
        self.counts[namespace or ""] = self.counts.get(namespace or "", 0) + 1
        while len(self.asks) > MAX_WAITING:  # the oldest ask of the namespace with the most
            most = max(self.counts, key=self.counts.__getitem__)
            self.forget(next(k for k, (ns, _) in self.asks.items() if ns == most))

    def forget(self, key: str) -> None:
        found = self.asks.pop(key, None)
        if found is not None:
            self.total = self.total.minus(found[1])
            self.counts[found[0]] -= 1
            if not self.counts[found[0]]:
                del self.counts[found[0]]

    def by_namespace(self, but: str | None = None,
                     holds: Callable[[str], object] | None = None) -> dict[str, Amount]:
        """What the pods still waiting ask, by namespace, pod ``but`` left out; a pod that
        ``holds`` something now (it was placed) waits no more."""
        still = self.still_waiting
        gone = [k for k in self.asks if (still is not None and not still(k))
                or (holds is not None and holds(k))]
        for key in gone:
            self.forget(key)
        sums: dict[str, list[int]] = {}  # plain sums: thousands of asks per check
        for key, (ns, a) in self.asks.items():
            if key == but:
                continue
            t = sums.get(ns)
            if t is None:
                sums[ns] = [a.gpus, a.memory_mib, a.core_pct]
            else:
                t[0], t[1], t[2] = t[0] + a.gpus, t[1] + a.memory_mib, t[2] + a.core_pct
        return {ns: Amount(*t) for ns, t in sums.items()}


def wants(state: CohortState, member: str, amount: Amount,
          waiting: Mapping[str, Amount]) -> dict[str, Amount]:
    """Per member of ``member``'s cohort: what it would borrow holding what it holds plus
    what waits (``waiting``, by member), ``member`` holding ``amount`` more besides."""
    out = {}
    for peer in state.peers(member):
        extra = waiting.get(peer.name, Amount())
        if peer.name == member:
            extra = extra + amount
        out[peer.name] = state.charged(peer.name, extra).borrowed(peer.name)
    return out


def lent(state: CohortState, member: str, waiting: Mapping[str, Amount]) -> Amount:
    """What ``member``'s cohort lends, each member's waiting pods (``waiting``, by member)
    counted as taking back their part of its idle nominal first: per member
    ``min(lendable, max(0, nominal − used − waiting))``, summed. Never more than
    ``borrowable`` (nothing waiting: equal to it), never a member's lending limit."""
    total = {d: 0 for d in DIMS}
    for p in state.peers(member):
        used, asks = state.used_by(p.name), waiting.get(p.name, Amount())
        for d in DIMS:
            gap = (p.nominal_of(d) or 0) - getattr(used, d) - getattr(asks, d)
            total[d] += min(p.lendable(d), max(0, gap))
    return Amount(**total)


def divided(state: CohortState, member: str, wanted: Mapping[str, Amount],
            waiting: Mapping[str, Amount]) -> dict[str, Amount]:
    """The fair shares of ``member``'s cohort: ``cohort.fair_shares`` of what it ``lent``
    (lenders' own waiting pods within their nominal counted out) among the ``wanted``."""
    cohort = state.member(member).cohort
    assert cohort is not None
    return fair_shares(state, cohort, wanted, lent(state, member, waiting))


def surely_within(state: CohortState, member: str, amount: Amount, waiting: Amount) -> bool:
    """A cheap sufficient condition for ``beyond_fair_share`` being None: even if every
    member wanted all it borrows plus everything that waits (``waiting``: an upper bound of
    the waiting asks, of any member), the cohort would lend enough for all of it — the
    division gives everyone its want."""
    after = state.charged(member, amount)
    now, then = state.borrowed(member), after.borrowed(member)
    dims = [d for d in DIMS if getattr(then, d) > getattr(now, d)]  # the only ones judged
    if not dims:
        return True
    capacity = after.borrowable(member)
    borrowed = Amount()
    for p in after.peers(member):
        borrowed = borrowed + after.borrowed(p.name)
    return all(getattr(borrowed, d) + getattr(waiting, d) <= getattr(capacity, d)
               for d in dims)


def beyond_fair_share(state: CohortState, member: str, amount: Amount,
                      waiting: Mapping[str, Amount]) -> FairShare | None:
    """None when ``member`` borrowing for ``amount`` stays within its fair share of what its
    cohort lends (every counted dimension), else the first dimension it would pass."""
    if state.member(member).cohort is None:
        return None
    return _beyond(state, member, amount, _division(state, member, amount, waiting))


_Division = tuple[Mapping[str, Amount], CohortState, Mapping[str, Amount]]
"""What each member wants, the state with ``amount`` charged, and the fair shares then."""


def _division(state: CohortState, member: str, amount: Amount,
              waiting: Mapping[str, Amount]) -> _Division:
    wanted = wants(state, member, amount, waiting)
    after = state.charged(member, amount)
    return wanted, after, divided(after, member, wanted, waiting)


def _beyond(state: CohortState, member: str, amount: Amount, division: _Division
            ) -> FairShare | None:
    wanted, after, shares = division
    m = state.member(member)
    now, then = state.borrowed(member), after.borrowed(member)
    for dim in DIMS:
        grows = getattr(then, dim) > getattr(now, dim)
        if grows and getattr(then, dim) > getattr(shares[member], dim):
            weights = sum(p.weight for p in state.peers(member)
                          if getattr(wanted[p.name], dim) > 0)
            return FairShare(member, str(m.cohort), dim, getattr(amount, dim),
                             getattr(now, dim), getattr(shares[member], dim), m.weight,
                             weights)
    return None


def _num(x: float) -> str:
    f = Fraction(x).limit_denominator(1000)
    return str(f.numerator) if f.denominator == 1 else f"{float(x):g}"


def fairness_reclaim(state: CohortState, member: str, amount: Amount,
                     waiting: Mapping[str, Amount]) -> tuple[Amount, frozenset[str]] | None:
    """When ``member`` borrowing for ``amount`` stays within its fair share but the cohort
    lent everything out: (what the pool is short, the members that borrow beyond their fair
    share) — the borrowed pods of those may be reclaimed for it (``cohort.reclaim``). None
    when it would pass its own share, the pool is not short, or nobody is over its share."""
    if state.member(member).cohort is None:
        return None
    division = _division(state, member, amount, waiting)
    if _beyond(state, member, amount, division) is not None:
        return None
    _, after, shares = division
    over = frozenset(p.name for p in state.peers(member) if p.name != member and any(
        getattr(state.borrowed(p.name), d) > getattr(shares[p.name], d) for d in DIMS))
    need = Amount(**{d: max(0, after.pool(member, d)[1] - after.pool(member, d)[0])
                     for d in DIMS})
    return None if not over or need == Amount() else (need, over)


# -- the fair share a member is entitled to now (status, metrics) ----------------------------
@dataclass(frozen=True, slots=True)
class Entitlement:
    """A member's fair share now, per dimension: what it would borrow holding what it holds
    plus what waits (``wanted``), its share of what the cohort lends (``share``, the figure
    a fair-share refusal names), and what it may hold while the others want more
    (``entitled``: nominal + share; None where the nominal does not count the dimension)."""

    member: str
    cohort: str
    weight: float
    used: Amount
    borrowed: Amount
    wanted: Amount
    share: Amount
    entitled: Limit

    def ratio(self, dim: str) -> float | None:
        """``used / entitled`` (None: not counted; ``inf``: holds something of a dimension
        it is entitled to none of). Above 1 exactly when it borrows beyond its share."""
        cap: int | None = getattr(self.entitled, dim)
        used: int = getattr(self.used, dim)
        if cap is None:
            return None
        if cap == 0:
            return 0.0 if used == 0 else inf
        return used / cap

    @property
    def beyond(self) -> tuple[str, ...]:
        """The counted dimensions in which it borrows more than its fair share (its
        borrowed pods may be reclaimed for a member within its share)."""
        return tuple(d for d in DIMS if getattr(self.entitled, d) is not None
                     and getattr(self.borrowed, d) > getattr(self.share, d))

    @property
    def dominant(self) -> tuple[str, float] | None:
        """The counted dimension of the largest ``ratio``, and that ratio (None: no
        dimension is counted)."""
        found = [(r, d) for d in DIMS if (r := self.ratio(d)) is not None]
        if not found:
            return None
        r, d = max(found, key=lambda x: (x[0], -DIMS.index(x[1])))
        return d, r


def entitlements(state: CohortState, cohort: str, waiting: Mapping[str, Amount]
                 ) -> dict[str, Entitlement]:
    """Every member of ``cohort``'s fair share now, by the arithmetic ``beyond_fair_share``
    enforces (``wants`` with nothing more asked, then ``divided``); ``waiting``: what each
    member's waiting pods ask."""
    members = [m for _, m in sorted(state.members.items()) if m.cohort == cohort]
    if not members:
        return {}
    wanted = wants(state, members[0].name, Amount(), waiting)
    shares = divided(state, members[0].name, wanted, waiting)
    out = {}
    for m in members:
        share = shares[m.name]
        entitled = Limit(*(None if (n := m.nominal_of(d)) is None else n + getattr(share, d)
                           for d in DIMS))
        out[m.name] = Entitlement(m.name, cohort, m.weight, state.used_by(m.name),
                                  state.borrowed(m.name), wanted[m.name], share, entitled)
    return out
