"""The ``Quota`` need: victims whose quota charges add up to an amount, anywhere in the
cluster (taking quota back). See ``victims``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpupool.core.quota import Amount, amount_of_allocation
from gpupool.core.room import share_milli
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
class Quota:
    """Charges adding up to ``amount`` (each dimension asked > 0), anywhere."""

    state: ClusterState
    amount: Amount


# -- Quota ---------------------------------------------------------------------------------------
def select_quota(need: Quota, pool: list[Candidate], allowed: Mapping[str, int],
                  limits: Limits) -> Selection | NoVictims:
    pool = sorted((c for c in pool if not c.leaving), key=lambda c: (c.priority, c.key))
    amounts = [c.charge.amount if c.charge is not None else amount_of_allocation(c.allocation)
               for c in pool]
    shares = [share_milli(need.state, c.allocation) for c in pool]
    wanted = [(f, getattr(need.amount, f)) for f in ("gpus", "memory_mib", "core_pct")
              if getattr(need.amount, f) > 0]

    fits = adds_up(amounts, wanted)

    def rank(chosen: Chosen) -> Rank:
        return rank_of([pool[k] for k in chosen], sum(shares[k] for k in chosen), 0)

    found = SetSearch(pool, fits, allowed, rank, limits.trials,
                      spare_in_turn(amounts, wanted)).best()
    if found is None:
        return NoVictims(f"the pods that may be evicted hold less than "
                         f"{need.amount.describe()} that their disruption budgets let go")
    chosen, exact = found
    return Selection(by_priority(pool[k] for k in chosen), None,
                     sum(shares[k] for k in chosen), 0, exact)


Wanted = list[tuple[str, int]]
"""(dimension of ``Amount``, how much of it is needed), for each dimension asked."""


def adds_up(amounts: Sequence[Amount], wanted: Wanted) -> Callable[[Chosen], bool]:
    """Whether the charges of a set add up to what is wanted."""
    def fits(chosen: Chosen) -> bool:
        return all(sum(getattr(amounts[k], f) for k in chosen) >= n for f, n in wanted)
    return fits


def spare_in_turn(amounts: Sequence[Amount], wanted: Wanted
                  ) -> Callable[[Chosen, Sequence[int]], Chosen]:
    """``SetSearch``'s reprieve for ``adds_up``: in ``order``, spare each pod the rest
    still adds up without, keeping running sums (one pass, not a sum per pod)."""
    def spare(chosen: Chosen, order: Sequence[int]) -> Chosen:
        total = {f: sum(getattr(amounts[k], f) for k in chosen) for f, _ in wanted}
        kept = set(chosen)
        for k in order:
            if all(total[f] - getattr(amounts[k], f) >= n for f, n in wanted):
                kept.discard(k)
                for f, _ in wanted:
                    total[f] -= getattr(amounts[k], f)
        return tuple(j for j in chosen if j in kept)
    return spare
