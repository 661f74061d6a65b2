"""Fair sharing in the replay with tenants, as the running system does it (the extender's
filter and quota preemption, ``core.tenantshare``):

* **the cap** — in a cohort that shares fairly, a pod that would borrow waits while its
  group's borrowed amount with it would pass the group's fair share of what the cohort
  lends (``beyond_fair_share``), the members' wants counting what their queued pods ask
  (``Waiting``), the pod's own ask once;
* **reclaim for fairness** — a pod within its group's fair share, refused because the cohort
  lent everything out, takes borrowed pods of the members beyond their fair share
  (``fairness_reclaim`` says how much and from whom; ``core.cohort.reclaim`` chooses the
  pods with ``core.victims.select``: fewest, lowest priorities, youngest).

Pure: states and queues in, decisions out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpupool.core.cohort import DIMS, CohortState, reclaim
from gpupool.core.quota import Amount
from gpupool.core.state import ClusterState
from gpupool.core.tenantshare import beyond_fair_share, fairness_reclaim
from gpupool.core.victims import Candidate


class Waiting:
    """What the queued pods of each group ask (their lower bounds), kept as pods enter and
    leave the queue."""

    def __init__(self) -> None:
        self.by_group: dict[str, Amount] = {}

    def add(self, group: str | None, amount: Amount) -> None:
        if group is not None:
            self.by_group[group] = self.by_group.get(group, Amount()) + amount

    def remove(self, group: str | None, amount: Amount) -> None:
        if group is not None:
            self.by_group[group] = self.by_group.get(group, Amount()).minus(amount)

    def but(self, group: str, queued: Amount) -> Mapping[str, Amount]:
        """What waits, one queued pod of ``group`` (``queued``: what it was queued with)
        left out: it asks for itself."""
        left = self.by_group.get(group, Amount())
        return {**self.by_group, group: Amount(*(max(0, getattr(left, d) - getattr(queued, d))
                                                 for d in DIMS))}


def capped(cohort: CohortState, group: str, amount: Amount, waiting: Mapping[str, Amount]
           ) -> bool:
    """Whether borrowing for ``amount`` would take ``group`` beyond its fair share, the
    others wanting what they hold and ``waiting`` (by group, the pod itself left out)."""
    return beyond_fair_share(cohort, group, amount, waiting) is not None


def fairness_victims(cohort: CohortState, group: str, amount: Amount,
                     waiting: Mapping[str, Amount], running: Sequence[Candidate],
                     cluster: ClusterState) -> tuple[Candidate, ...] | None:
    """The borrowed pods to evict for ``group``'s pod of ``amount`` (within its fair share,
    refused because the cohort lent everything out); none when the borrowed pods of the
    members beyond their shares cannot give enough back; None when it is not the case (as
    in the extender, a pod for which reclaim for fairness applies preempts nothing else)."""
    found = fairness_reclaim(cohort, group, amount, waiting)
    if found is None:
        return None
    need, over = found
    plan = reclaim(cohort, group, need, running, cluster,
                   lambda c: None if c.charge is None or c.charge.group not in over
                   else c.charge.group)
    return plan.victims if plan.restored else ()
