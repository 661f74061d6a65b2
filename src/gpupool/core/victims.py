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

Room for a whole gang is ``victims_gang.select_gang``: this chooser per member, and a
gang's members are victims only all together.

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

from collections.abc import Iterable, Mapping

from gpupool.core.victims_eligibility import (
    Candidate,
    Eligible,
    all_of,
    any_of,
    below,
    in_group,
    in_tenant,
)
from gpupool.core.victims_quota import Quota, select_quota
from gpupool.core.victims_room import Room, select_room
from gpupool.core.victims_search import Limits, NoVictims, Selection

__all__ = ["Candidate", "Eligible", "Limits", "Need", "NoVictims", "Quota", "Room",
           "Selection", "all_of", "any_of", "below", "in_group", "in_tenant", "select"]

Need = Room | Quota
DEFAULT_LIMITS = Limits()


def select(need: Need, candidates: Iterable[Candidate], eligible: Eligible = lambda c: True,
           budgets: Mapping[str, int] | None = None, limits: Limits = DEFAULT_LIMITS
           ) -> Selection | NoVictims:
    """The best set of eligible candidates whose eviction meets ``need`` (see module)."""
    allowed = dict(budgets or {})
    pool = [c for c in candidates if c.leaving or (eligible(c) and _budgeted(c, allowed))]
    if isinstance(need, Quota):
        return select_quota(need, pool, allowed, limits)
    return select_room(need, pool, allowed, limits)


def _budgeted(c: Candidate, allowed: Mapping[str, int]) -> bool:
    return all(allowed.get(b, 0) > 0 for b in c.budgets)
