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
* ``limits``: how many victim sets may be tried (``Limits``).

Order, best first: fewest victims; then the lowest priorities (the victims' priorities,
highest first, compared in turn); then the least GPU share freed beyond the need (milli-GPU:
per GPU the larger of the compute and memory fractions; a Room's need is its request's
share on that node); then node order; then keys. Sets are tried smallest first, so within
``limits.trials`` the answer is exact. Past it the answer is the best set seen or the
greedy set (every eligible pod, then as many spared as still meet the need, highest
priority first, as kube-scheduler reprieves): minimal, no victim could be spared, but
perhaps not the smallest; ``Selection.exact`` says which. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

from gpupool.core.allocation import Allocation
from gpupool.core.fit import NO_CONSTRAINTS, Constraints
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
    """``trials``: victim sets tried per node (per need for ``Quota``); ``nodes``: nodes
    searched exactly (the most promising by their greedy set), the rest greedily."""

    trials: int = 2000
    nodes: int = 16


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
            excess, order, tuple(sorted(c.key for c in victims)))


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
        if state.allocations.get(c.key) == c.allocation:  # only what the state holds
            by_node.setdefault(c.allocation.node, []).append(c)
    rows = range(len(state.nodes)) if need.rows is None else sorted(set(need.rows))
    options: list[tuple[NodeRoom, list[Candidate]]] = []
    for i in rows:
        here = by_node.get(state.nodes[i].name, [])
        removable = sorted((c for c in here if not c.leaving),
                           key=lambda c: (c.priority, -share_milli(state, c.allocation), c.key))
        room = NodeRoom.of(state, request, need.constraints, i,
                           [c.allocation for c in removable],
                           [c.allocation for c in here if c.leaving])
        if room is not None:
            options.append((room, removable))
    if not options:
        return NoVictims(f"no node has room for {request.describe()} even without every "
                         "pod it may preempt")
    return _best_node(options, allowed, limits)


def _search_on(room: NodeRoom, pool: list[Candidate], allowed: Mapping[str, int],
               limits: Limits) -> _Search:
    needed = room.needed()

    def rank(chosen: Chosen) -> Rank:
        excess = sum(room.shares[k] for k in chosen) - needed
        return _rank([pool[k] for k in chosen], excess, room.row)
    return _Search(pool, room.fits, allowed, rank, limits.trials)


def _best_node(options: list[tuple[NodeRoom, list[Candidate]]], allowed: Mapping[str, int],
               limits: Limits) -> Selection | NoVictims:
    searches = [_search_on(room, pool, allowed, limits) for room, pool in options]
    ranked = sorted((s.rank(g), n) for n, s in enumerate(searches)
                    if (g := s.greedy()) is not None)
    best: tuple[Rank, Selection] | None = None
    for place, (_, n) in enumerate(ranked):
        (room, pool), search = options[n], searches[n]
        largest = None if best is None else len(best[1].victims)
        greedy = search.greedy()
        found = search.best(largest) if place < limits.nodes else (
            (greedy, False) if greedy is not None else None)
        if found is None or not room.verified(found[0]):
            continue
        rank = search.rank(found[0])
        if best is None or rank < best[0]:
            chosen, exact = found
            best = (rank, Selection(_by_priority(pool[k] for k in chosen), room.node,
                                    sum(room.shares[k] for k in chosen), room.needed(), exact))
    if best is None:
        return NoVictims("the disruption budgets of the pods that could make room let too "
                         "few of them go")
    return best[1]
