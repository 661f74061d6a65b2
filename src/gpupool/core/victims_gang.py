"""The ``GangRoom`` need: pods of lower priority whose eviction lets a whole gang be placed
(docs/design/preemption.md, "Room for a gang"). See ``victims`` for the chooser of one
pod's room, which this one calls per member.

``select_gang(need, candidates, eligible, budgets, limits)``:

1. **Nobody, if that does.** On a scratch copy of the state without the leaving
   candidates, the gang is placed as ``gang.place_gang`` places it: if it fits, the
   selection is empty. A gang refused for another reason than room (a member's class,
   permissions or group; the gang's quota) is not helped by evictions: ``NoVictims``.
2. **Member by member.** The members are placed in ``place_gang``'s order (the largest GPU
   ask first, by the packing policy, each seeing the members placed before it); a member
   that does not fit gets its room from ``victims.select`` with ``Room`` on the scratch
   copy — the fewest pods outside gangs first; gang members only when those cannot make
   it — and its victims leave the copy before the next member is placed. A gang asked to
   stay ``together`` is tried node by node or domain by domain: those whose free GPU room
   plus what eligible pods hold there covers the quorum's asks, the tightest first, at
   most ``limits.nodes``; the outcome with the fewest victims wins (then the lowest
   priorities, then the domain's name).
3. **A gang is a victim whole.** A candidate that is a gang's member (``Candidate.gang``)
   is eligible only when every running member of that gang is (lower priority, within the
   budgets); choosing one takes them all, wherever they run, so a victim gang never keeps
   part of its members on GPUs without its quorum. The whole set must stay within the
   disruption budgets, as for any victims.
4. **Enough or nothing.** Once the quorum is placed, the answer is the victims and the
   gang's placement on the copy (allocations and charges, the exact charges checked
   against the gang's quota once more). Otherwise ``NoVictims``: nothing is to be evicted
   when the room would still not suffice.

Greedy per member, not the fewest victims over every set for the whole gang (that search
grows exponentially with the members): each member takes the best set for itself given
the members placed before it. Pure and deterministic (``rng`` reaches only policies that
draw from it).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from gpupool.core.allocation import Allocation
from gpupool.core.eligibility import Catalogue
from gpupool.core.fit import Constraints
from gpupool.core.gang import (
    Gang,
    GangPlacement,
    Rule,
    Together,
    ask_of,
    domain_groups,
    exact_outcome,
    member_rules,
    place_gang,
    placing_order,
)
from gpupool.core.placement import Placer
from gpupool.core.reasons import Check
from gpupool.core.request import PodRequest
from gpupool.core.scoring import Policy
from gpupool.core.state import ClusterState, IntArray
from gpupool.core.victims_eligibility import Candidate, Eligible
from gpupool.core.victims_room import Room, select_room
from gpupool.core.victims_search import Limits, NoVictims, by_priority

_LIMITS = Limits()


@dataclass(frozen=True, slots=True)
class GangRoom:
    """Room for ``gang`` on ``state``, placed by ``policy`` (``catalogue`` and ``rule``
    as ``place_gang`` takes them)."""

    state: ClusterState
    gang: Gang
    policy: Policy
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    catalogue: Catalogue | None = None
    rule: Rule | None = None


@dataclass(frozen=True, slots=True)
class GangSelection:
    """The victims (highest priority first; empty: leaving pods make the room) and the
    gang's placement once they are gone."""

    victims: tuple[Candidate, ...]
    placement: GangPlacement

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(c.key for c in self.victims)


@dataclass(frozen=True, slots=True)
class _Pool:
    """Who may be chosen: pods outside gangs, and the members of the gangs that may go
    whole (gang -> its running members)."""

    singles: list[Candidate]
    members: list[Candidate]
    gangs: Mapping[str, list[Candidate]]


def select_gang(need: GangRoom, candidates: Iterable[Candidate],
                eligible: Eligible = lambda c: True, budgets: Mapping[str, int] | None = None,
                limits: Limits = _LIMITS) -> GangSelection | NoVictims:
    """The victims whose eviction lets ``need``'s gang be placed whole (see the module)."""
    cands = list(candidates)
    allowed = dict(budgets or {})
    base = need.state.snapshot().state()
    for c in cands:
        if c.leaving and base.allocations.get(c.key) == c.allocation:
            base.release(c.key)  # their room is free for every need
    placed = place_gang(base, need.gang, need.policy, need.rng, need.catalogue, rule=need.rule)
    if placed.ok:
        return GangSelection((), placed)
    assert placed.reason is not None
    if placed.reason.check is not Check.GPU_FREE:
        return NoVictims(placed.reason.message)
    pool = _pool_of(cands, eligible, allowed)
    best: tuple[tuple[object, ...], GangSelection] | None = None
    for where, rows in _where(base, need, pool, limits):
        found = _Greedy(need, base, pool, allowed, limits, rows).run(where)
        if found is not None:
            rank = (len(found.victims), tuple(c.priority for c in found.victims), where)
            if best is None or rank < best[0]:
                best = rank, found
    if best is None:
        return NoVictims(f"gang {need.gang.name}: evicting every pod of lower priority that "
                         f"may go would still not make room for {need.gang.quorum} of its "
                         "members together")
    return best[1]


def _pool_of(cands: Sequence[Candidate], eligible: Eligible, allowed: Mapping[str, int]
             ) -> _Pool:
    ok = {c.key for c in cands if not c.leaving and eligible(c) and
          all(allowed.get(b, 0) > 0 for b in c.budgets)}
    running: dict[str, list[Candidate]] = {}
    for c in cands:
        if c.gang and not c.leaving:
            running.setdefault(c.gang, []).append(c)
    whole = {g: ms for g, ms in running.items() if all(m.key in ok for m in ms) and
             not _over(ms, allowed)}
    return _Pool([c for c in cands if c.key in ok and not c.gang],
                 [c for c in cands if c.gang in whole], whole)


def _over(victims: Iterable[Candidate], allowed: Mapping[str, int]) -> bool:
    """Whether ``victims`` take more pods of a disruption budget than it lets go."""
    used: dict[str, int] = {}
    for c in victims:
        for b in c.budgets:
            used[b] = used.get(b, 0) + 1
    return any(n > allowed.get(b, 0) for b, n in used.items())


def _where(state: ClusterState, need: GangRoom, pool: _Pool, limits: Limits
           ) -> list[tuple[str, IntArray | None]]:
    """Where to try: the whole cluster, or the nodes or domains whose free room plus what
    the pool's pods hold there covers the quorum's asks (the tightest first)."""
    gang = need.gang
    if gang.together is Together.ANYWHERE:
        return [("", None)]
    ruled = member_rules(state, gang, need.catalogue, need.rule)
    asks = [ask_of(state, gang.members[i])
            for i in placing_order(state, gang, ruled)[:gang.quorum]]
    wanted = (sum(a[0] for a in asks), sum(a[1] for a in asks))
    ok = state.present & state.healthy
    cores = np.where(ok, state.core_free, 0).sum(1)
    units = np.where(ok, state.unit_free, 0).sum(1)
    for c in [*pool.singles, *pool.members]:
        i = state.index.get(c.allocation.gpu_node)
        if i is not None:
            cores[i] += sum(s.core_pct for s in c.allocation.slices)
            units[i] += sum(state.units_for(s.memory_mib) for s in c.allocation.slices)
    room = []
    for name, rows in domain_groups(state, gang).items():
        r = (int(cores[rows].sum()), int(units[rows].sum()))
        if r[0] >= wanted[0] and r[1] >= wanted[1]:
            room.append((r, name, np.asarray(rows, np.int64)))
    room.sort(key=lambda x: (x[0], x[1]))
    return [(name, rows) for _, name, rows in room[:limits.nodes]]


class _Greedy:
    """One try: the members placed in order on a scratch copy, each making its room."""

    def __init__(self, need: GangRoom, base: ClusterState, pool: _Pool,
                 allowed: Mapping[str, int], limits: Limits, rows: IntArray | None):
        self.need, self.pool, self.limits, self.rows = need, pool, limits, rows
        self.scratch = base.snapshot().state()
        self.left = dict(allowed)
        self.victims: dict[str, Candidate] = {}
        self.placer = Placer(need.policy)
        self.ruled = member_rules(base, need.gang, need.catalogue, need.rule)
        self.order = placing_order(base, need.gang, self.ruled)

    def run(self, where: str) -> GangSelection | None:
        gang = self.need.gang
        found: dict[int, Allocation] = {}
        for n, i in enumerate(self.order):
            if len(found) >= gang.quorum or len(found) + len(self.order) - n < gang.quorum:
                break
            member, c = gang.members[i], self.ruled[i]
            alloc = self.placer.decide(self.scratch, member, self.need.rng, c, self.rows,
                                       explain_limit=1).allocation
            if alloc is None:
                alloc = self._make_room(member, c)
            if alloc is not None:
                self.scratch.reserve(alloc)
                found[i] = alloc
        if len(found) < gang.quorum:
            return None
        placement = exact_outcome(gang, found, self.ruled, where, self.need.catalogue)
        if not placement.ok:
            return None
        return GangSelection(by_priority(self.victims.values()), placement)

    def _make_room(self, member: PodRequest, c: Constraints) -> Allocation | None:
        """Evict (on the copy) the fewest pods that let ``member`` fit: pods outside gangs
        first, then gangs too, whole; its allocation on the node they free."""
        pools = [self.pool.singles]
        if self.pool.members:
            pools.append([*self.pool.singles, *self.pool.members])
        rows = None if self.rows is None else [int(i) for i in self.rows]
        for pool in pools:
            here = [v for v in pool if v.key not in self.victims and
                    self.scratch.allocations.get(v.key) == v.allocation]
            chosen = select_room(Room(self.scratch, member, c, rows), here, self.left,
                                 self.limits)
            if isinstance(chosen, NoVictims) or chosen.node is None:
                continue
            taken = self._whole(chosen.victims)
            if _over(taken, self.left):
                continue
            alloc = self._take(taken, member, c, chosen.node)
            if alloc is not None:
                return alloc
        return None

    def _whole(self, chosen: Iterable[Candidate]) -> list[Candidate]:
        """``chosen`` with every running member of the gangs among them."""
        out: dict[str, Candidate] = {}
        for v in chosen:
            for w in self.pool.gangs.get(v.gang, [v]) if v.gang else [v]:
                if w.key not in self.victims:
                    out[w.key] = w
        return list(out.values())

    def _take(self, taken: list[Candidate], member: PodRequest, c: Constraints, node: str
              ) -> Allocation | None:
        """Release ``taken`` from the copy and place ``member`` on ``node``; undone when it
        still does not fit there."""
        released = [v for v in taken if self.scratch.release(v.key) is not None]
        row = np.array([self.scratch.index[node]], np.int64)
        alloc = self.placer.decide(self.scratch, member, self.need.rng, c, row,
                                   explain_limit=1).allocation
        if alloc is None:
            for v in released:
                self.scratch.reserve(v.allocation)
            return None
        for v in taken:
            self.victims[v.key] = v
            for b in v.budgets:
                self.left[b] = self.left.get(b, 0) - 1
        return alloc
