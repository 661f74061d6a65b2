"""The search for a victim set, whatever the need: smallest sets first, under the
disruption budgets, best by rank (``SetSearch``); the greedy set past the trial limit; and
the values a search answers with (``Limits``, ``Selection``, ``NoVictims``). See
``victims`` for the order a set is ranked by."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

from gpupool.core.victims_eligibility import Candidate


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


# -- the search, whatever the need -------------------------------------------------------------
Rank = tuple[object, ...]
Chosen = tuple[int, ...]


@dataclass(slots=True)
class SetSearch:
    """Smallest sets first over ``pool`` (sets are tuples of indexes into it), under
    ``fits`` and the budgets, best by ``rank``."""

    pool: Sequence[Candidate]
    fits: Callable[[Chosen], bool]
    allowed: Mapping[str, int]
    rank: Callable[[Chosen], Rank]
    trials: int
    spare: Callable[[Chosen, Sequence[int]], Chosen] | None = None
    """The reprieve for a need whose fit is a sum (``Quota``): spares, in ``order``, each
    pod the rest still fits without, in one pass of running sums instead of a fit check
    of the whole set per pod (quadratic: minutes at 40,000 eligible pods)."""
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
        if self.spare is not None:
            chosen = self.spare(chosen, order)
        else:
            for k in order:
                rest = tuple(j for j in chosen if j != k)
                if self.fits(rest):
                    chosen = rest
        return chosen if self.within(chosen) else None

    def best(self) -> tuple[Chosen, bool] | None:
        """(the best set, whether it is exact), trying sizes 1 up; None when none
        qualifies."""
        if self.fits(()):
            return (), True  # leaving pods make the room: nobody need go
        greedy = self.greedy()
        top = len(self.pool) if greedy is None else len(greedy)
        tried = 0
        for size in range(1, top + 1):
            found: Chosen | None = None
            for chosen in combinations(range(len(self.pool)), size):
                tried += 1
                if tried > self.trials:
                    return self._cut_short(found, greedy)
                if self.within(chosen) and self.fits(chosen) and (
                        found is None or self.rank(chosen) < self.rank(found)):
                    found = chosen
            if found is not None:
                return found, True
        return None

    def _cut_short(self, found: Chosen | None, greedy: Chosen | None
                   ) -> tuple[Chosen, bool] | None:
        options = [s for s in (found, greedy) if s is not None]
        return (min(options, key=self.rank), False) if options else None


def rank_of(victims: Sequence[Candidate], excess: int, order: int) -> Rank:
    return (len(victims), tuple(sorted((c.priority for c in victims), reverse=True)),
            tuple(sorted(-c.started_s for c in victims)), excess, order,
            tuple(sorted(c.key for c in victims)))


def by_priority(victims: Iterable[Candidate]) -> tuple[Candidate, ...]:
    return tuple(sorted(victims, key=lambda c: (-c.priority, c.key)))
