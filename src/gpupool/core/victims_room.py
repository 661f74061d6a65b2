"""The ``Room`` need: the fewest victims on one node that let a request fit there, node by
node in the order of their lowest candidate priority (``RoomSearch``), each node's room
worked out by ``room.NodeRoom``. See ``victims``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from gpupool.core.fit import NO_CONSTRAINTS, Constraints, feasible_rows
from gpupool.core.request import PodRequest
from gpupool.core.room import NodeRoom
from gpupool.core.state import ClusterState
from gpupool.core.victims_eligibility import Candidate
from gpupool.core.victims_search import (
    Chosen,
    Limits,
    NoVictims,
    Rank,
    Selection,
    SetSearch,
    by_priority,
    rank_of,
)


@dataclass(frozen=True, slots=True)
class Room:
    """Room for ``request`` on one node among ``rows`` (state rows; None: every node)."""

    state: ClusterState
    request: PodRequest
    constraints: Constraints = NO_CONSTRAINTS
    rows: Sequence[int] | None = None


# -- Room -----------------------------------------------------------------------------------------
def select_room(need: Room, pool: list[Candidate], allowed: Mapping[str, int],
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
            for name in c.allocation.nodes:  # a remote slice frees room on two nodes
                by_node.setdefault(name, []).append(c)
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
        return rank_of([self.pool[k] for k in chosen], excess, self.room.row)

    def search(self, trials: int) -> SetSearch:
        return SetSearch(self.pool, self.room.fits, self.allowed, self.rank, trials)

    def selection(self, chosen: Chosen, exact: bool) -> Selection:
        return Selection(by_priority(self.pool[k] for k in chosen), self.room.node,
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

    def _sets(self, opt: _Option, search: SetSearch, pool: tuple[int, ...], size: int
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
