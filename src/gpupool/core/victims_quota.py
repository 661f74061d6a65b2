"""The ``Quota`` need: victims whose quota charges add up to an amount, anywhere in the
cluster (taking quota back). See ``victims``."""

from __future__ import annotations

from collections.abc import Mapping
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

    def fits(chosen: Chosen) -> bool:
        return all(sum(getattr(amounts[k], f) for k in chosen) >= n for f, n in wanted)

    def rank(chosen: Chosen) -> Rank:
        return rank_of([pool[k] for k in chosen], sum(shares[k] for k in chosen), 0)

    found = SetSearch(pool, fits, allowed, rank, limits.trials).best()
    if found is None:
        return NoVictims(f"the pods that may be evicted hold less than "
                         f"{need.amount.describe()} that their disruption budgets let go")
    chosen, exact = found
    return Selection(by_priority(pool[k] for k in chosen), None,
                     sum(shares[k] for k in chosen), 0, exact)
