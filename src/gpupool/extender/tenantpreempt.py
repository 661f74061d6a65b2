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

With those victims counted out (their allocations and charges set aside, under the cache
lock, and put back), the pod must still find a node among those kube-scheduler sent; pods
of lower priority on it may be chosen too (``victims.Room``), as in plain preemption. The
result is an ordinary ``plans.Plan`` the ``Preemptor`` carries out (hold in the node's
GPULedger, then evictions), marked ``anywhere``: quota victims may run on other nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from gpupool.core.allocation import Allocation
from gpupool.core.cohort import Verdict, reclaim
from gpupool.core.eligibility import request_amount
from gpupool.core.fit import Constraints
from gpupool.core.quota import Amount, Charge, Limit
from gpupool.core.reasons import Check
from gpupool.core.request import PodRequest
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
from gpupool.extender.cache import ClusterCache
from gpupool.extender.plans import Plan, Victim
from gpupool.extender.podspec import pod_id, pod_priority

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


def quota_victims(cache: ClusterCache, request: PodRequest, priority: int,
                  pods: list[Candidate], limits: Any
                  ) -> tuple[tuple[Candidate, ...], str] | NoVictims:
    """(victims, why) that make ``request`` fit every tenant quota covering it."""
    catalogue, state = cache.catalogue, cache.state
    mask = catalogue.classes.request_mask(state, request.gpu_class, request.selector) \
        if request.gpu_class is None or request.gpu_class in catalogue.classes else None
    amount = request_amount(state, request, mask)
    chosen: list[Candidate] = []
    why = ""
    for quota in catalogue.tenants.covering(request.tenant):
        left = [c for c in pods if c not in chosen]
        found = _for_quota(cache, quota, request, amount, priority, left, limits)
        if isinstance(found, NoVictims):
            return found
        chosen.extend(found[0])
        why = why or found[1]
    if not chosen:
        return NoVictims("no tenant quota is short of anything a victim could give back")
    return tuple(chosen), why


def _for_quota(cache: ClusterCache, quota: TenantQuota, request: PodRequest, amount: Amount,
               priority: int, pods: list[Candidate], limits: Any
               ) -> tuple[tuple[Candidate, ...], str] | NoVictims:
    tenants, book, state = cache.catalogue.tenants, cache.catalogue.quotas, cache.state
    budgets = cache.budgets.allowed()
    if quota.cohort is not None:
        admission = tenants.admission(book, quota, amount)
        if admission.verdict is Verdict.RECLAIMS:
            members = {ns: f"tenant {q.name}" for q in tenants for ns in q.namespaces}
            plan = reclaim(tenants.cohort(book, quota), f"tenant {quota.name}",
                           admission.reclaim, pods, state, _member(members), budgets, limits)
            if not plan.restored:
                return NoVictims(plan.reason)
            return plan.victims, (f"{RECLAIM} tenant {quota.name} lent to cohort "
                                  f"{quota.cohort}")
        if admission.verdict is Verdict.REFUSED and not admission.permanent \
                and tenants.shares_fairly(quota.cohort):
            fair = _for_fairness(cache, quota, request.key, amount, pods, limits)
            if fair is not None:
                return fair
    own: Eligible = all_of(below(priority), _in(quota.namespaces))
    short = _short(quota.limit if quota.cohort is None else _with_borrowing(quota),
                   tenants.used(book, quota), amount)
    if quota.cohort is not None and tenants.admission(book, quota, amount).admitted:
        short = Amount()
    chosen: tuple[Candidate, ...] = ()
    if short != Amount():
        found = select(Quota(state, short), pods, own, budgets, limits)
        if isinstance(found, NoVictims):
            return NoVictims(f"tenant {quota.name}'s quota is full and none of its own pods "
                             f"of lower priority can give back {short.describe()}: "
                             f"{found.message}")
        chosen = found.victims
    limit = quota.class_limit(request.gpu_class)
    if limit is not None:
        in_class: Eligible = all_of(own, lambda c: c.charge is not None and
                                    c.charge.gpu_class == request.gpu_class)
        used = tenants.used(book, quota, request.gpu_class)
        used = used.minus(_sum(c for c in chosen if in_class(c)))
        short = _short(limit, used, amount)
        if short != Amount():
            found = select(Quota(state, short), [c for c in pods if c not in chosen],
                           in_class, budgets, limits)
            if isinstance(found, NoVictims):
                return found
            chosen += found.victims
    return chosen, f"tenant {quota.name}'s quota is full: its pods of lower priority make way"


def _for_fairness(cache: ClusterCache, quota: TenantQuota, key: str, amount: Amount,
                  pods: list[Candidate], limits: Any
                  ) -> tuple[tuple[Candidate, ...], str] | NoVictims | None:
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
    plan = reclaim(state, me, need, pods, cache.state, _member(members),
                   cache.budgets.allowed(), limits)
    if not plan.restored:
        return NoVictims(plan.reason)
    return plan.victims, (f"{RECLAIM} from tenants beyond their fair share of cohort "
                          f"{cohort} for tenant {quota.name}")


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


def plan(cache: ClusterCache, pod: Mapping[str, Any], request: PodRequest, rows: Sequence[int],
         candidates: Candidates, hold_of: HoldOf, limits: Any) -> Plan | NoVictims:
    """A preemption plan for a pod its tenant quota refuses (see the module)."""
    priority = pod_priority(pod)
    everyone = candidates(request.key, range(len(cache.state.nodes)))
    found = quota_victims(cache, request, priority, everyone, limits)
    if isinstance(found, NoVictims):
        return found
    victims, why = found
    with set_aside(cache, victims):
        c = cache.modes.constraints(cache.state, request, cache.catalogue)
        if c.blocked is not None:
            return NoVictims(f"with its victims gone the pod is still refused: "
                             f"{c.blocked.message}")
        taken = {v.key for v in victims}
        local = [x for x in candidates(request.key, rows) if x.key not in taken]
        room = select(Room(cache.state, request, c, rows), local, below(priority),
                      cache.budgets.allowed(), limits)
        if isinstance(room, NoVictims):
            return NoVictims(f"{why}, but no sent node has room for it: {room.message}")
        node = room.node or ""
        hold = hold_of(request, c, node, room, local)
    if hold is None:
        return NoVictims(f"the policy found no place on {node} once the victims are gone")
    ident = pod_id(pod)
    chosen = (*victims, *room.victims)
    leaving = tuple(x.key for x in local if x.leaving and x.allocation.node == node)
    return Plan(request.key, ident.namespace, ident.name, priority, node, hold,
                tuple(Victim(x.key, *_where(cache, x.key), x.priority) for x in chosen),
                leaving, request, c.group, anywhere=True, why=why)


def _where(cache: ClusterCache, uid: str) -> tuple[str, str]:
    f = cache.pods[uid]
    return f.namespace, f.name
