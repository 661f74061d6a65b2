"""Victims: the fewest pods whose eviction meets a need — gpupool's one chooser of whom to
evict, for priority preemption and for taking quota back.

Interface::

    select(need, candidates, eligible, budgets, limits) -> Selection | NoVictims

* ``candidates`` (``Candidate``): running pods gpupool may evict. Each carries what goes
  with it (its ``Allocation``: node, GPU slices, CPU and memory), its ``priority``, its
  quota ``charge`` (amount, tenant, class, group), the disruption ``budgets`` that cover
  it, and whether it is ``leaving`` already (being deleted: its room counts as free for
  every need, and it is never chosen, being on its way out).
* ``eligible``: a predicate that scopes the choice. Priority preemption passes
  ``below(p)``; preemption inside a tenant's quota ``all_of(below(p), in_tenant(t))``;
  taking back capacity a group lent ``borrowing(group)``-style predicates the caller
  writes over ``Candidate.charge``. ``all_of`` and ``any_of`` combine them.
* ``need``: what removing the victims must achieve —
  ``Room(state, request, constraints, rows)``: ``request`` fits one node among ``rows``
  once the victims and every leaving pod are gone, by the core's own fit rules
  (``room.NodeRoom``: ``fit.feasible_rows`` in plain integers, and the core itself on a
  scratch copy of the chosen node); every candidate's allocation must be held in
  ``state`` (others are ignored). The selection names the node; an empty one means the
  leaving pods make the room. ``Quota(state, amount)``: the victims' charges add up to at
  least ``amount`` in every dimension it asks (> 0), anywhere in the cluster.
* ``budgets``: how many more pods each PodDisruptionBudget lets go (name -> count). A set
  that takes more pods of a budget than it allows is never chosen (the Eviction API would
  refuse the rest); a candidate naming a budget the mapping lacks is not eligible.
* ``limits``: how many victim sets may be tried and how many nodes' room worked out
  (``Limits``), which bounds the time a call takes.

Order, best first: fewest victims; then the lowest priorities (the victims' priorities,
highest first, compared in turn); then the youngest (``Candidate.started_s``, latest
first, compared in turn); then the least GPU share freed beyond the need (milli-GPU:
per GPU the larger of the compute and memory fractions; a Room's need is its request's
share on that node); then node order; then keys. Sets are tried smallest first, and what
cannot beat the best set found is skipped (``room.NodeRoom.branches`` bounds how few
victims a node needs; nodes whose candidates all have priorities above the best set's are
never looked at), so within ``limits`` the answer is exact. Past them the answer is the
best set seen or a greedy set (every eligible pod, then as many spared as still meet the
need, highest priority first, as kube-scheduler reprieves): minimal, no victim could be
spared, but perhaps not the smallest; ``Selection.exact`` says which. Pure: no I/O, no
clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from gpupool.core.allocation import Allocation
from gpupool.core.fit import NO_CONSTRAINTS, Constraints, feasible_rows
from gpupool.core.quota import Amount, Charge, amount_of_allocation
from gpupool.core.request import PodRequest
from gpupool.core.room import NodeRoom, share_milli
from gpupool.core.state import ClusterState


@dataclass(frozen=True, slots=True)
class Candidate:
    """A running pod that may be evicted, and what goes with it."""

    allocation: Allocation
    priority: int = 0
    charge: Charge | None = None
    budgets: tuple[str, ...] = ()
    leaving: bool = False
    started_s: float = 0.0  # when it started (any clock); the younger goes first at a tie

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


@dataclass(frozen=True, slots=True)
class Room:
    """Room for ``request`` on one node among ``rows`` (state rows; None: every node)."""

    state: ClusterState
    request: PodRequest
    constraints: Constraints = NO_CONSTRAINTS
    rows: Sequence[int] | None = None


@dataclass(frozen=True, slots=True)
class Quota:
    """Charges adding up to ``amount`` (each dimension asked > 0), anywhere."""

    state: ClusterState
    amount: Amount


Need = Room | Quota


@dataclass(frozen=True, slots=True)
class Limits:
    """``trials``: victim sets tried (each a fit check of a few microseconds); ``nodes``:
    nodes whose room is worked out (about half a millisecond each), those with the
    lowest-priority candidates first. Past either, the answer is not known to be the best."""

    trials: int = 5000
    nodes: int = 100


@dataclass(frozen=True, slots=True)
class Selection:
    """The victims (highest priority first), the node (``Room``), the GPU share they free
    and the share the need takes, and whether the set is the best (``exact``)."""

    victims: tuple[Candidate, ...]
    node: str | None
    freed_milli: int
    needed_milli: int
    exact: bool

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(c.key for c in self.victims)


@dataclass(frozen=True, slots=True)
class NoVictims:
    """Why no set of eligible pods meets the need (a sentence)."""

    message: str


def select(need: Need, candidates: Iterable[Candidate], eligible: Eligible = lambda c: True,
           budgets: Mapping[str, int] | None = None, limits: Limits = Limits()
           ) -> Selection | NoVictims:
    """The best set of eligible candidates whose eviction meets ``need`` (see module)."""
    allowed = dict(budgets or {})
    pool = [c for c in candidates if c.leaving or (eligible(c) and _budgeted(c, allowed))]
    if isinstance(need, Quota):
        return _select_quota(need, pool, allowed, limits)
    return _select_room(need, pool, allowed, limits)


def _budgeted(c: Candidate, allowed: Mapping[str, int]) -> bool:
    return all(allowed.get(b, 0) > 0 for b in c.budgets)


# -- the search, whatever the need -------------------------------------------------------------
Rank = tuple[object, ...]
Chosen = tuple[int, ...]


@dataclass(slots=True)
class _Search:
    """Smallest sets first over ``pool`` (sets are tuples of indexes into it), under
    ``fits`` and the budgets, best by ``rank``."""

    pool: Sequence[Candidate]
    fits: Callable[[Chosen], bool]
    allowed: Mapping[str, int]
    rank: Callable[[Chosen], Rank]
    trials: int
    _greedy: list[Chosen | None] = field(default_factory=list)

    def within(self, chosen: Chosen) -> bool:
        """Whether ``chosen`` takes no budget past what it allows."""
        return not self._over_used(chosen)

    def _over_used(self, chosen: Iterable[int]) -> set[str]:
        used: dict[str, int] = {}
        for k in chosen:
            for b in self.pool[k].budgets:
                used[b] = used.get(b, 0) + 1
        return {b for b, n in used.items() if n > self.allowed.get(b, 0)}

    def greedy(self) -> Chosen | None:
        """Every pod, then spare as many as still fit: pods of over-used budgets first,
        then by priority, highest first (kube-scheduler's reprieve). None: even every
        pod does not fit, or the budgets still forbid what is left."""
        if not self._greedy:
            self._greedy.append(self._reprieved())
        return self._greedy[0]

    def _reprieved(self) -> Chosen | None:
        chosen = tuple(range(len(self.pool)))
        if not self.fits(chosen):
            return None
        over = self._over_used(chosen)
        order = sorted(chosen, key=lambda k: (not set(self.pool[k].budgets) & over,
                                              -self.pool[k].priority, k))
        for k in order:
            rest = tuple(j for j in chosen if j != k)
            if self.fits(rest):
                chosen = rest
        return chosen if self.within(chosen) else None

    def best(self, largest: int | None = None) -> tuple[Chosen, bool] | None:
        """(the best set, whether it is exact), trying sizes 1 up to ``largest`` (a set
        found elsewhere has that size: larger ones cannot win); None when none qualifies."""
        if self.fits(()):
            return (), True  # leaving pods make the room: nobody need go
        greedy = self.greedy()
        top = len(self.pool) if greedy is None else len(greedy)
        top = top if largest is None else min(top, largest)
        tried = 0
        for size in range(1, top + 1):
            found: Chosen | None = None
            for chosen in combinations(range(len(self.pool)), size):
                tried += 1
                if tried > self.trials:
                    return self._cut_short(found, greedy, largest)
                if self.within(chosen) and self.fits(chosen) and (
                        found is None or self.rank(chosen) < self.rank(found)):
                    found = chosen
            if found is not None:
                return found, True
        return None

    def _cut_short(self, found: Chosen | None, greedy: Chosen | None, largest: int | None
                   ) -> tuple[Chosen, bool] | None:
        options = [s for s in (found, greedy)
                   if s is not None and (largest is None or len(s) <= largest)]
        return (min(options, key=self.rank), False) if options else None


def _rank(victims: Sequence[Candidate], excess: int, order: int) -> Rank:
    return (len(victims), tuple(sorted((c.priority for c in victims), reverse=True)),
            tuple(sorted(-c.started_s for c in victims)), excess, order,
            tuple(sorted(c.key for c in victims)))


def _by_priority(victims: Iterable[Candidate]) -> tuple[Candidate, ...]:
    return tuple(sorted(victims, key=lambda c: (-c.priority, c.key)))


# -- Quota ---------------------------------------------------------------------------------------
def _select_quota(need: Quota, pool: list[Candidate], allowed: Mapping[str, int],
                  limits: Limits) -> Selection | NoVictims:
    pool = sorted((c for c in pool if not c.leaving), key=lambda c: (c.priority, c.key))
    amounts = [c.charge.amount if c.charge is not None else amount_of_allocation(c.allocation)
               for c in pool]
    shares = [share_milli(need.state, c.allocation) for c in pool]
    wanted = [(f, getattr(need.amount, f)) for f in ("gpus", "memory_mib", "core_pct")
              if getattr(need.amount, f) > 0]

    def fits(chosen: Chosen) -> bool:
        return all(sum(getattr(amounts[k], f) for k in chosen) >= n for f, n in wanted)

    def rank(chosen: Chosen) -> Rank:
        return _rank([pool[k] for k in chosen], sum(shares[k] for k in chosen), 0)

    found = _Search(pool, fits, allowed, rank, limits.trials).best()
    if found is None:
        return NoVictims(f"the pods that may be evicted hold less than "
                         f"{need.amount.describe()} that their disruption budgets let go")
    chosen, exact = found
    return Selection(_by_priority(pool[k] for k in chosen), None,
                     sum(shares[k] for k in chosen), 0, exact)


# -- Room -----------------------------------------------------------------------------------------
def _select_room(need: Room, pool: list[Candidate], allowed: Mapping[str, int],
                 limits: Limits) -> Selection | NoVictims:
    state, request = need.state, need.request
    if not request.gpus:
        return NoVictims(f"pod {request.key} asks no GPU: gpupool frees GPU room only")
    if need.constraints.blocked is not None:
        return NoVictims(need.constraints.blocked.message)
    by_node: dict[str, list[Candidate]] = {}
    for c in pool:
        held = state.allocations.get(c.key)
        if held is c.allocation or held == c.allocation:  # only what the state holds
            by_node.setdefault(c.allocation.node, []).append(c)
    rows = list(range(len(state.nodes))) if need.rows is None else sorted(set(need.rows))
    return _RoomSearch(need, by_node, allowed, limits).run(rows)


@dataclass(slots=True)
class _Option:
    """One node's room and its removable candidates (in the room's order)."""

    room: NodeRoom
    pool: list[Candidate]
    allowed: Mapping[str, int]
    needed: int = -1

    def rank(self, chosen: Chosen) -> Rank:
        if self.needed < 0:
            self.needed = self.room.needed()
        excess = sum(self.room.shares[k] for k in chosen) - self.needed
        return _rank([self.pool[k] for k in chosen], excess, self.room.row)

    def search(self, trials: int) -> _Search:
        return _Search(self.pool, self.room.fits, self.allowed, self.rank, trials)

    def selection(self, chosen: Chosen, exact: bool) -> Selection:
        return Selection(_by_priority(self.pool[k] for k in chosen), self.room.node,
                         sum(self.room.shares[k] for k in chosen), self.room.needed(), exact)


Best = tuple[Rank, _Option, Chosen]


@dataclass(slots=True)
class _RoomSearch:
    """Nodes in the order of their lowest candidate priority (nodes with leaving pods
    first: they may need nobody); per node its branches, fewest victims needed first, and
    smallest sets first within each; whatever cannot beat the best set found (more
    victims, or lowest possible priorities above its) is skipped unbuilt. ``limits.trials``
    sets at most, then the best seen or a greedy set."""

    need: Room
    by_node: dict[str, list[Candidate]]
    allowed: Mapping[str, int]
    limits: Limits
    best: Best | None = None
    tried: int = 0
    exact: bool = True
    options: list[_Option] = field(default_factory=list)

    def run(self, rows: Sequence[int]) -> Selection | NoVictims:
        state, need = self.need.state, self.need
        fits_now = feasible_rows(state, need.request, need.constraints,
                                 np.array(rows, np.int64))[0].tolist()
        first: list[int] = []  # nodes that may need nobody: room now, or pods leaving
        order: list[tuple[int, int]] = []
        for i, now in zip(rows, fits_now, strict=True):
            here = self.by_node.get(state.nodes[i].name, [])
            lowest = min((c.priority for c in here if not c.leaving), default=None)
            if now or lowest is None or any(c.leaving for c in here):
                first.append(i)
            else:
                order.append((lowest, i))
        built = [opt for i in first if (opt := self._option(i)) is not None]
        free = [opt for opt in built if opt.room.fits(()) and opt.room.verified(())]
        if free:  # leaving pods make the room: nobody need go
            return min(free, key=lambda o: o.rank(())).selection((), True)
        for opt in built:
            if not self._branches(opt):
                return self._cut_short()
        for lowest, i in sorted(order):
            if self.best is not None and (1, (lowest,)) > self.best[0][:2]:
                break  # every node left has only pods of higher priority than the victims
            if len(self.options) >= self.limits.nodes:
                self.exact = False
                break
            opt = self._option(i)
            if opt is not None and not self._branches(opt):
                return self._cut_short()
        if self.best is None:
            return NoVictims(self._none_why())
        return self.best[1].selection(self.best[2], self.exact)

    def _option(self, i: int) -> _Option | None:
        state, need = self.need.state, self.need
        here = self.by_node.get(state.nodes[i].name, [])
        removable = sorted((c for c in here if not c.leaving), key=lambda c: (c.priority, c.key))
        room = NodeRoom.of(state, need.request, need.constraints, i,
                           [c.allocation for c in removable],
                           [c.allocation for c in here if c.leaving])
        if room is None:
            return None
        opt = _Option(room, removable, self.allowed)
        self.options.append(opt)
        return opt

    def _branches(self, opt: _Option) -> bool:
        """Search the node's branches; False once the trial limit is reached."""
        search = opt.search(0)
        for branch in opt.room.branches():
            if self.best is not None and branch.bound > len(self.best[2]):
                break  # branches come fewest victims first
            pool = opt.room.pool_of(branch.targets)
            priorities = [opt.pool[k].priority for k in pool]  # ascending: the pool's order
            for size in range(max(branch.bound, 1), len(pool) + 1):
                if self.best is not None and \
                        (size, tuple(reversed(priorities[:size]))) > self.best[0][:2]:
                    break  # no set of this size here can beat it, nor any larger one
                found = self._sets(opt, search, pool, size)
                if found is None:
                    return False
                if found:
                    break
        self.exact = self.exact and not opt.room.capped
        return True

    def _sets(self, opt: _Option, search: _Search, pool: tuple[int, ...], size: int
              ) -> bool | None:
        """Try every set of ``size`` pods of ``pool``: whether one became the best (None:
        the trial limit was reached)."""
        found = False
        for chosen in combinations(pool, size):
            self.tried += 1
            if self.tried > self.limits.trials:
                return None
            if search.within(chosen) and opt.room.fits(chosen):
                rank = opt.rank(chosen)
                if (self.best is None or rank < self.best[0]) and opt.room.verified(chosen):
                    self.best, found = (rank, opt, chosen), True
        return found

    def _cut_short(self) -> Selection | NoVictims:
        """Past the trial limit: the best set seen, else a node's greedy set (both minimal,
        neither known to be the best)."""
        if self.best is not None:
            return self.best[1].selection(self.best[2], False)
        for opt in self.options:
            greedy = opt.search(self.limits.trials).greedy()
            if greedy is not None and opt.room.verified(greedy):
                return opt.selection(greedy, False)
        return NoVictims(self._none_why())

    def _none_why(self) -> str:
        if not self.options:
            return (f"no node has room for {self.need.request.describe()} even without "
                    "every pod it may preempt")
        return "the disruption budgets of the pods that could make room let too few of them go"
