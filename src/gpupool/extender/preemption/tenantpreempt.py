"""Preemption inside a tenant's quota, and reclaim of capacity a tenant lent its cohort.

When filter refuses a GPU pod because a TenantQuota is full (not permanently: the pod
would fit the quota if something of the tenant's went), ``plan`` chooses whom to evict
with the one victim chooser, ``core.victims.select``:

* **priorities inside quota** — the tenant's own pods of strictly lower priority whose
  charges add up to what is short (``victims.Quota``), in the quota's namespaces (and, for
  a per-class limit, of that class);
* **reclaim** — a tenant within its nominal quota whose cohort lent that capacity out
  (``core.cohort`` says *reclaims*): borrowed pods of the other members of the cohort,
  whatever their priority, chosen by ``core.cohort.reclaim`` (which calls
  ``victims.select``);
* **reclaim for fairness** — in a cohort that shares fairly, a tenant within its fair share
  refused because the cohort lent everything out: borrowed pods of the members beyond
  their fair share (``core.tenantshare.fairness_reclaim``, then ``core.cohort.reclaim``).

It is planned in the planner's three steps (``planner``): ``needs`` (under the cache
lock, with the ask: what each quota is short of and whose pods may give it back, as
values), ``choose`` (off the lock, on the ask's snapshot and copies: the victims), and
``recheck`` (under the lock: the needs are still the same and the victims unchanged).
With those victims counted out (their allocations and charges set aside, under the
cache lock, and put back), the pod must still find a node among those kube-scheduler
sent; pods of lower priority on it may be chosen too (``victims.Room``), as in plain
preemption. The result is an ordinary ``plans.Plan`` the ``Preemptor`` carries out (hold
in the node's GPULedger, then evictions), marked ``anywhere``: quota victims may run on
other nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from gpupool.core.allocation import Allocation
from gpupool.core.cohort import Verdict, reclaim
from gpupool.core.cohort_state import CohortState
from gpupool.core.eligibility import request_amount
from gpupool.core.fit import Constraints
from gpupool.core.quota import Amount, Charge, Limit
from gpupool.core.reasons import Check
from gpupool.core.request import PodRequest
from gpupool.core.state import ClusterState
from gpupool.core.tenants import TenantQuota
from gpupool.core.tenantshare import fairness_reclaim
from gpupool.core.victims import (
    Candidate,
    Eligible,
    NoVictims,
    Quota,
    Room,
    Selection,
    all_of,
    below,
    select,
)
from gpupool.extender.preemption.plans import Plan, Victim
from gpupool.extender.state.cache import ClusterCache

RECLAIM = "taking back capacity"  # how a reclaim's plan says what it is for
Candidates = Callable[[str, Sequence[int]], list[Candidate]]
HoldOf = Callable[[PodRequest, Constraints, str, Selection, list[Candidate]], "Allocation | None"]


def kind_of(plan: Plan) -> str:
    """``reclaim`` or ``priority``: what a tenant quota's plan is for (metrics)."""
    return "reclaim" if plan.why.startswith(RECLAIM) else "priority"


def is_quota_refusal(constraints: Constraints) -> bool:
    """Filter refused the pod for a quota that something of the tenant's going would
    satisfy (a permanent refusal asks more than the whole quota: nobody can help)."""
    b = constraints.blocked
    return b is not None and b.check is Check.QUOTA and not b.permanent


@dataclass(frozen=True, slots=True)
class Own:
    """The tenant's own pods of lower priority give back ``short`` (and, for a per-class
    limit, of that class, what the class is still short once those are counted)."""

    tenant: str
    namespaces: frozenset[str]
    priority: int
    short: Amount
    gpu_class: str | None
    class_limit: Limit | None
    class_used: Amount  # the class's use by the tenant (with a class limit)
    asked: Amount


@dataclass(frozen=True, slots=True)
class Reclaim:
    """Borrowed pods of cohort members give back ``need`` to ``me`` (``cohort.reclaim``)."""

    cohort: CohortState
    me: str
    need: Amount
    members: Mapping[str, str]  # namespace -> cohort member whose pods may be taken
    why: str


Need = Own | Reclaim
Needs = tuple[Need, ...]


@dataclass(frozen=True, slots=True)
class Chosen:
    """The quota's victims (off the cache lock) and what they are evicted for."""

    victims: tuple[Candidate, ...]
    why: str


def needs(cache: ClusterCache, request: PodRequest, priority: int) -> Needs | NoVictims:
    """What each tenant quota covering ``request`` is short of, and whose pods may give it
    back (under the cache lock: the catalogue's verdicts, as values; cheap)."""
    catalogue, state = cache.catalogue, cache.state
    mask = catalogue.classes.request_mask(state, request.gpu_class, request.selector) \
        if request.gpu_class is None or request.gpu_class in catalogue.classes else None
    amount = request_amount(state, request, mask)
    out = tuple(_need(cache, q, request, amount, priority)
                for q in catalogue.tenants.covering(request.tenant))
    return out or NoVictims("no tenant quota covers the pod")


def _need(cache: ClusterCache, quota: TenantQuota, request: PodRequest, amount: Amount,
          priority: int) -> Need:
    tenants, book = cache.catalogue.tenants, cache.catalogue.quotas
    if quota.cohort is not None:
        admission = tenants.admission(book, quota, amount)
        if admission.verdict is Verdict.RECLAIMS:
            members = {ns: f"tenant {q.name}" for q in tenants for ns in q.namespaces}
            return Reclaim(tenants.cohort(book, quota), f"tenant {quota.name}",
                           admission.reclaim, members,
                           f"{RECLAIM} tenant {quota.name} lent to cohort {quota.cohort}")
        if admission.verdict is Verdict.REFUSED and not admission.permanent \
                and tenants.shares_fairly(quota.cohort):
            fair = _for_fairness(cache, quota, request.key, amount)
            if fair is not None:
                return fair
    short = _short(quota.limit if quota.cohort is None else _with_borrowing(quota),
                   tenants.used(book, quota), amount)
    if quota.cohort is not None and tenants.admission(book, quota, amount).admitted:
        short = Amount()
    limit = quota.class_limit(request.gpu_class)
    used = tenants.used(book, quota, request.gpu_class) if limit is not None else Amount()
    return Own(quota.name, quota.namespaces, priority, short, request.gpu_class, limit, used,
               amount)


def choose(wanted: Needs, pods: list[Candidate], state: ClusterState,
           budgets: Mapping[str, int], limits: Any) -> Chosen | NoVictims:
    """The victims that make the pod fit every quota of ``wanted`` (pure: off the cache
    lock, on a snapshot)."""
    chosen: list[Candidate] = []
    why = ""
    for need in wanted:
        left = [c for c in pods if c not in chosen]
        found = _reclaimed(need, left, state, budgets, limits) if isinstance(need, Reclaim) \
            else _own(need, left, state, budgets, limits)
        if isinstance(found, NoVictims):
            return found
        chosen.extend(found.victims)
        why = why or found.why
    if not chosen:
        return NoVictims("no tenant quota is short of anything a victim could give back")
    return Chosen(tuple(chosen), why)


def _reclaimed(need: Reclaim, pods: list[Candidate], state: ClusterState,
               budgets: Mapping[str, int], limits: Any) -> Chosen | NoVictims:
    plan = reclaim(need.cohort, need.me, need.need, pods, state, _member(need.members),
                   budgets, limits)
    return Chosen(plan.victims, need.why) if plan.restored else NoVictims(plan.reason)


def _own(need: Own, pods: list[Candidate], state: ClusterState, budgets: Mapping[str, int],
         limits: Any) -> Chosen | NoVictims:
    own: Eligible = all_of(below(need.priority), _in(need.namespaces))
    chosen: tuple[Candidate, ...] = ()
    if need.short != Amount():
        found = select(Quota(state, need.short), pods, own, budgets, limits)
        if isinstance(found, NoVictims):
            return NoVictims(f"tenant {need.tenant}'s quota is full and none of its own pods "
                             f"of lower priority can give back {need.short.describe()}: "
                             f"{found.message}")
        chosen = found.victims
    if need.class_limit is not None:
        in_class: Eligible = all_of(own, lambda c: c.charge is not None and
                                    c.charge.gpu_class == need.gpu_class)
        used = need.class_used.minus(_sum(c for c in chosen if in_class(c)))
        short = _short(need.class_limit, used, need.asked)
        if short != Amount():
            found = select(Quota(state, short), [c for c in pods if c not in chosen],
                           in_class, budgets, limits)
            if isinstance(found, NoVictims):
                return found
            chosen += found.victims
    return Chosen(chosen, f"tenant {need.tenant}'s quota is full: its pods of lower priority "
                          "make way")


def _for_fairness(cache: ClusterCache, quota: TenantQuota, key: str, amount: Amount
                  ) -> Reclaim | None:
    """Reclaim for fairness: a tenant within its fair share, refused because its cohort
    lent everything out, takes borrowed pods of the members beyond their fair share
    (``tenantshare.fairness_reclaim``, then ``cohort.reclaim``). None: not the case."""
    tenants, book, cohort = cache.catalogue.tenants, cache.catalogue.quotas, quota.cohort or ""
    state, me = tenants.cohort(book, quota), f"tenant {quota.name}"
    found = fairness_reclaim(state, me, amount, tenants.waiting_by_member(book, cohort, key))
    if found is None:
        return None
    need, over = found
    members = {ns: f"tenant {q.name}" for q in tenants if f"tenant {q.name}" in over
               for ns in q.namespaces}
    return Reclaim(state, me, need, members, f"{RECLAIM} from tenants beyond their fair "
                   f"share of cohort {cohort} for tenant {quota.name}")


def _member(members: Mapping[str, str]) -> Callable[[Candidate], str | None]:
    return lambda c: None if c.charge is None else members.get(c.charge.tenant or "")


def _in(namespaces: frozenset[str]) -> Eligible:
    return lambda c: c.charge is not None and c.charge.tenant in namespaces


def _with_borrowing(q: TenantQuota) -> Limit:
    def top(n: int | None, extra: int | None) -> int | None:
        return None if n is None or extra is None else n + extra
    b = q.borrowing_limit or Limit()
    return Limit(top(q.limit.gpus, b.gpus), top(q.limit.memory_mib, b.memory_mib),
                 top(q.limit.core_pct, b.core_pct))


def _short(limit: Limit, used: Amount, asked: Amount) -> Amount:
    """How much must go so that ``used + asked`` fits ``limit`` (dimensions asked only)."""
    def gap(cap: int | None, u: int, m: int) -> int:
        return 0 if cap is None or m <= 0 else max(u + m - cap, 0)
    return Amount(gap(limit.gpus, used.gpus, asked.gpus),
                  gap(limit.memory_mib, used.memory_mib, asked.memory_mib),
                  gap(limit.core_pct, used.core_pct, asked.core_pct))


def _sum(cs: Iterator[Candidate] | Sequence[Candidate]) -> Amount:
    total = Amount()
    for c in cs:
        if c.charge is not None:
            total = total + c.charge.amount
    return total


@contextmanager
def set_aside(cache: ClusterCache, victims: Sequence[Candidate]) -> Iterator[None]:
    """The victims' allocations and quota charges taken out for the block, then put back
    (under the cache lock)."""
    released: list[tuple[Allocation, Charge | None]] = []
    for c in victims:
        alloc = cache.state.release(c.key)
        if alloc is not None:
            released.append((alloc, cache.catalogue.quotas.refund(c.key)))
    try:
        yield
    finally:
        for alloc, charge in released:
            cache.state.reserve(alloc)
            if charge is not None:
                cache.catalogue.quotas.charge(alloc.key, charge)


def recheck(cache: ClusterCache, wanted: Needs, want: Any, chosen: Chosen,
            placed: Candidates, hold_of: HoldOf) -> Plan | str:
    """The plan ``chosen`` makes for ``want`` (a ``planner.Want``) if it still holds on
    the live state, else why not (under the cache lock, after ``flush``): every quota is
    still short by the very needs it was chosen for; every victim is still there, holding
    the allocation chosen, not leaving, not displaced, of the same priority, within its
    disruption budgets. Then, with the victims set aside, the pod must pass its quotas
    and find room on a sent node: one with room now if there is one (no candidates are
    built), else pods of lower priority there are chosen too (``victims.Room``, under the
    lock)."""
    request, priority = want.request, want.priority
    if needs(cache, request, priority) != wanted:
        return "the tenant's quota changed"
    victims = _live(cache, request.key, chosen.victims, placed)
    if isinstance(victims, str):
        return victims
    over = over_budget(victims, cache.budgets.allowed())
    if over:
        return f"the disruption budget {over} no longer lets its pods go"
    rows = [cache.state.index[n] for n in want.sent if n in cache.state.index]
    return _room(cache, want, Chosen(victims, chosen.why), rows, placed, hold_of)


def _live(cache: ClusterCache, key: str, chosen: Sequence[Candidate], placed: Candidates
          ) -> tuple[Candidate, ...] | str:
    state = cache.state
    rows = sorted({state.index[c.allocation.node] for c in chosen
                   if c.allocation.node in state.index})
    here = {c.key: c for c in placed(key, rows)}
    for v in chosen:
        c = here.get(v.key)
        if c is None or c.allocation != v.allocation or c.leaving or c.charge != v.charge:
            return f"pod {pod_name(cache, v.key)} is gone, leaving, moved or displaced"
        if c.priority != v.priority:
            return f"pod {pod_name(cache, v.key)} changed priority"
    return tuple(here[v.key] for v in chosen)


def _room(cache: ClusterCache, want: Any, chosen: Chosen, rows: Sequence[int],
          placed: Candidates, hold_of: HoldOf) -> Plan | str:
    """With the quota's victims set aside: the pod's place on a sent node (under the
    lock)."""
    request, priority, victims = want.request, want.priority, chosen.victims
    with set_aside(cache, victims):
        c = cache.modes.constraints(cache.state, request, cache.catalogue)
        if c.blocked is not None:
            return f"with its victims gone the pod is still refused: {c.blocked.message}"
        need, allowed = Room(cache.state, request, c, rows), cache.budgets.allowed()
        local: list[Candidate] = []  # a sent node with room now needs no candidates
        room = select(need, local, below(priority), allowed, want.limits)
        if isinstance(room, NoVictims):
            taken = {v.key for v in victims}
            local = [x for x in placed(request.key, rows) if x.key not in taken]
            room = select(need, local, below(priority), allowed, want.limits)
        if isinstance(room, NoVictims):
            return f"{chosen.why}, but no sent node has room for it: {room.message}"
        node = room.node or ""
        hold = hold_of(request, c, node, room, local)
    if hold is None:
        return f"the policy found no place on {node} once the victims are gone"
    every = (*victims, *room.victims)
    leaving = tuple(x.key for x in local if x.leaving and x.allocation.node == node)
    return Plan(request.key, want.namespace, want.name, priority, node, hold,
                tuple(victim_of(cache, x.key, x.priority) for x in every),
                leaving, request, c.group, anywhere=True, why=chosen.why)


def over_budget(victims: Sequence[Candidate], allowed: Mapping[str, int]) -> str:
    """A disruption budget ``victims`` take more of than it allows ('' when none)."""
    used: dict[str, int] = {}
    for c in victims:
        for b in c.budgets:
            used[b] = used.get(b, 0) + 1
    return next((b for b, n in sorted(used.items()) if n > allowed.get(b, 0)), "")


def pod_name(cache: ClusterCache, uid: str) -> str:
    """``namespace/name`` of a pod the cache knows, else its uid."""
    f = cache.pods.get(uid)
    return f"{f.namespace}/{f.name}" if f is not None else uid


def victim_of(cache: ClusterCache, uid: str, priority: int) -> Victim:
    f = cache.pods[uid]
    return Victim(uid, f.namespace, f.name, priority)
