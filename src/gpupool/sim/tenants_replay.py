"""Timed replay with tenants: quota groups, cohorts, priorities, a queue, reclaim and
preemption inside a quota — through the same core as the extender.

Pods arrive at ``creation_s`` and wait in a queue until their group's quota admits them
(``core.cohort.admit``) and a node takes them (the policy, as in ``sim.timed``); then they
run for ``deletion_s − creation_s`` seconds (no deletion time: until the end).

* **Order** of a scheduling pass (after every instant at which something happened): pods
  whose group is within its nominal before pods that would borrow (Kueue's rule), then
  higher priority, then — in a cohort with fair sharing — the group with the lowest
  dominant share (``core.cohort.dominant_share``), then arrival. A pass stops trying a
  group's pods of one size and model set at the first that cannot start.
* **Reclaim**: a pod within its group's nominal whose capacity was lent out evicts borrowed
  pods of the cohort's other groups (``core.cohort.reclaim``); if its group's quota admits
  it but no node has room, borrowed pods of the others are chosen by
  ``core.victims.select`` with a ``Room`` need.
* **Priorities inside a quota**: a pod its group's quota refuses evicts the group's own
  pods of lower priority (``core.cohort.shortfall``, ``victims.select`` scoped
  ``all_of(below(p), in_group(g))``).
* Evicted pods keep their GPUs for ``grace_s`` (Kubernetes' termination grace period),
  then go back to the queue and, when started again, run their whole duration again (no
  checkpoint). While a group waits for its victims to leave, its pods that need an
  eviction are not planned again, and no pod of its cohort starts on borrowed capacity
  (it would take the room being made).
* **Fair sharing** (a cohort with ``fairSharing``), as the running system does it
  (``sim.tenants_fair``): a pod that would borrow beyond its group's fair share of what the
  cohort lends waits while others' pods wait too, and a pod within its group's fair share
  that the cohort cannot lend to reclaims borrowed pods of the groups beyond theirs.
* **Tenant quotas and permissions** (``sim.tenants_limits``): a pod its tenant's quota or
  class quota refuses waits (no eviction is planned for it); placement stays on the GPUs
  its tenant is permitted.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass
from fractions import Fraction

from gpupool.core.allocation import Allocation
from gpupool.core.cohort import (
    DIMS,
    CohortState,
    Verdict,
    admit,
    borrowed_keys,
    dominant_share,
    reclaim,
    shortfall,
)
from gpupool.core.errors import InvalidInput
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.quota import Amount, Charge, amount_of_allocation, amount_of_request
from gpupool.core.request import PodRequest
from gpupool.core.state import ClusterState
from gpupool.core.tenants import PermissionBook
from gpupool.core.victims import Candidate, Quota, Room, Selection, all_of, below, in_group, select
from gpupool.sim.scenario import Scenario
from gpupool.sim.tenants import Tenancy
from gpupool.sim.tenants_fair import Waiting, capped, fairness_victims
from gpupool.sim.tenants_limits import PermittedDecider, TenantLimits
from gpupool.sim.tenants_run import Tally, TenantRun

__all__ = ["GRACE_S", "Tally", "TenantRun", "run_tenants"]

GRACE_S = 30.0
"""Kubernetes' default terminationGracePeriodSeconds."""
LEAVE, RELEASE, ARRIVE = 0, 1, 2  # at one instant: departures, then arrivals
NO_GROUP = "(no quota)"


@dataclass(slots=True)
class _Pod:
    k: int
    request: PodRequest
    key: str
    tenant: str
    group: str | None
    priority: int
    arrival: float
    duration: float | None
    lower_bound: Amount
    started: float | None = None  # the first start (wait time)
    epoch: int = 0  # bumped at every start: a departure of an earlier run is stale
    running: Candidate | None = None
    leaving: bool = False
    for_group: str | None = None  # evicted: the group its eviction makes room for


def run_tenants(scenario: Scenario, tenancy: Tenancy, policy: str, seed: int,
                config: PolicyConfig, grace_s: float = GRACE_S) -> TenantRun:
    """Replay ``scenario`` under ``tenancy`` (see module)."""
    started = time.perf_counter()
    replay = _Replay(scenario, tenancy, policy, seed, config, grace_s)
    replay.run()
    return replay.result(time.perf_counter() - started)


class _Replay:
    def __init__(self, scenario: Scenario, tenancy: Tenancy, policy: str, seed: int,
                 config: PolicyConfig, grace_s: float):
        if grace_s < 0:
            raise InvalidInput(f"the eviction grace period must be >= 0 s, got {grace_s}")
        self.policy, self.seed, self.grace_s, self.tenancy = policy, seed, grace_s, tenancy
        self.state = ClusterState(scenario.nodes)
        self.decider = PermittedDecider(self.state, policy, config, seed, scenario,
                                        PermissionBook(tenancy.permissions))
        self.cohort = CohortState.of(tenancy.members)
        self.limits = TenantLimits(tenancy.quotas, tenancy.permissions)
        whole = min((g.memory_mib for n in scenario.nodes for g in n.gpus), default=0)
        self.pods = [self._pod(k, p.request, p.creation_s, p.deletion_s, whole)
                     for k, p in enumerate(scenario.pods)]
        self.by_key = {p.key: p for p in self.pods}
        self.live: dict[int, _Pod] = {}
        self.shares: dict[str, Fraction] = {}
        self.keys = tuple(dict.fromkeys([m.name for m in tenancy.members] +
                                        sorted({self._key(p) for p in self.pods})))
        self.tallies = {key: Tally() for key in self.keys}
        self.held = {key: 0 for key in self.keys}
        self.events: list[tuple[float, int, int, int]] = []
        self.queues: dict[tuple[object, ...], list[tuple[int, float, int]]] = {}
        self.awaiting: dict[str, int] = {}  # group -> victims still leaving for it
        self.reclaimed_at: dict[int, float] = {}  # pod -> when a reclaim was made for it
        self.times: list[float] = []
        self.curve_held: dict[str, list[int]] = {key: [] for key in self.keys}
        self.curve_borrowed: dict[str, list[int]] = {key: [] for key in self.keys}
        self.last_arrival = 0.0
        self.waiting = Waiting()  # what each group's queued pods ask (fair sharing)

    def _pod(self, k: int, request: PodRequest, created: float | None, deleted: float | None,
             whole: int) -> _Pod:
        if created is None:
            raise InvalidInput(f"tenants are replayed in time: pod {request.key} has no "
                               "creation time")
        group = self.tenancy.group_of(request.tenant)
        return _Pod(k, request, request.key, request.tenant or NO_GROUP, group,
                    self.tenancy.priorities.get(request.key, 0), created,
                    None if deleted is None else deleted - created,
                    amount_of_request(request, self.state.memory_unit_mib, whole))

    @staticmethod
    def _key(p: _Pod) -> str:
        return p.group or p.tenant

    # -- the loop --------------------------------------------------------------------------------
    def run(self) -> None:
        for p in self.pods:
            heapq.heappush(self.events, (p.arrival, ARRIVE, p.k, 0))
        self.last_arrival = max((p.arrival for p in self.pods), default=0.0)
        while self.events:
            now = self.events[0][0]
            while self.events and self.events[0][0] == now:
                _, kind, k, epoch = heapq.heappop(self.events)
                self._event(now, kind, k, epoch)
            self._schedule(now)
            self._record(now)

    def _event(self, now: float, kind: int, k: int, epoch: int) -> None:
        p = self.pods[k]
        if kind == ARRIVE:
            self.tallies[self._key(p)].pods += 1
            self.limits.arrived(p.request.tenant)
            self._enqueue(p)
        elif p.running is not None and p.epoch == epoch:
            self._stop(p)
            if p.leaving:  # evicted: gone after its grace period (or done within it)
                p.leaving = False
                if p.for_group is not None:
                    self.awaiting[p.for_group] -= 1
                p.for_group = None
                if kind == RELEASE:
                    self._enqueue(p)

    def _enqueue(self, p: _Pod) -> None:
        """Into the queue of its group, counted size and GPU models (see ``_schedule``)."""
        shape = (p.group, p.tenant, self._counted(p), p.request.models, p.request.gpu_class)
        heapq.heappush(self.queues.setdefault(shape, []), (-p.priority, p.arrival, p.k))
        self.waiting.add(p.group, p.lower_bound)

    def _counted(self, p: _Pod) -> Amount:
        """The pod's size in the dimensions its group's quota counts."""
        if p.group is None:
            return Amount()
        member = self.cohort.member(p.group)
        return Amount(**{d: getattr(p.lower_bound, d) if member.nominal_of(d) is not None
                         else 0 for d in DIMS})

    # -- scheduling ------------------------------------------------------------------------------
    def _schedule(self, now: float) -> None:
        """Try the queues' heads, best first. A group's order only worsens as its pods
        start (it borrows more), so a popped head whose order changed goes back in."""
        self.shares = {}  # dominant shares, dropped for a group when its pods start
        heads = [(self._order(q[0]), shape) for shape, q in self.queues.items() if q]
        heapq.heapify(heads)
        while heads:
            order, shape = heapq.heappop(heads)
            queue = self.queues[shape]
            if not queue:
                continue
            fresh = self._order(queue[0])
            if fresh != order and heads and fresh > heads[0][0]:
                heapq.heappush(heads, (fresh, shape))
                continue
            head = self.pods[queue[0][2]]
            if not self._try(head, now):  # this size of this group waits for a change
                if self.limits.noted is not None:
                    self.limits.behind([q.key for _, _, k in queue
                                        if (q := self.pods[k]).lower_bound == head.lower_bound])
                continue
            heapq.heappop(queue)
            self.waiting.remove(head.group, head.lower_bound)
            if queue:
                heapq.heappush(heads, (self._order(queue[0]), shape))

    def _order(self, entry: tuple[int, float, int]) -> tuple[object, ...]:
        p = self.pods[entry[2]]
        borrows, share = False, Fraction(0)
        if p.group is not None:
            member = self.cohort.member(p.group)
            used = self.cohort.used_by(p.group) + p.lower_bound
            borrows = any(getattr(used, d) > n for d in DIMS
                          if (n := member.nominal_of(d)) is not None)
            if member.cohort in self.tenancy.fair:
                share = self.shares.get(p.group, Fraction(-1))
                if share < 0:
                    share = self.shares[p.group] = dominant_share(self.cohort, p.group)
        return (borrows, -p.priority, share, p.arrival, p.k)

    def _try(self, p: _Pod, now: float) -> bool:
        """Start ``p`` now, or set evictions going for it; False: it waits."""
        if not self.limits.admits(p.key, p.request, p.lower_bound):
            return False
        if p.group is None:
            found = self._decide(p, now)
            return found is not None and self._admit_exact(p, now, found)
        first = admit(self.cohort, p.group, p.lower_bound)
        if first.verdict is Verdict.BORROWS and (self._evicting(p.group) or
                                                 self._capped(p, p.lower_bound)):
            return False  # what the evictions free is for the pods they are made for
        if first.verdict is Verdict.REFUSED:
            if self._may_evict(p.group) and (first.permanent or
                                             not self._reclaim_for_fairness(p, now)):
                self._preempt_own(p, now)
            return False
        allocation = self._decide(p, now)
        if allocation is None:
            if first.verdict is not Verdict.BORROWS and self._may_evict(p.group):
                self._reclaim_room(p, now)
            return False
        return self._admit_exact(p, now, allocation)

    def _admit_exact(self, p: _Pod, now: float, allocation: Allocation) -> bool:
        amount = amount_of_allocation(allocation)
        if not self.limits.admits(p.key, p.request, amount):
            return False
        if p.group is None:
            return self._start(p, now, allocation)
        exact = admit(self.cohort, p.group, amount)
        if exact.verdict is Verdict.BORROWS and self._capped(p, amount):
            return False
        if exact.admitted:
            return self._start(p, now, allocation)
        if exact.verdict is Verdict.RECLAIMS and self._may_evict(p.group):
            plan = reclaim(self.cohort, p.group, exact.reclaim, self._running(),
                           self.state)
            if plan.restored:
                self._evict(plan.victims, p, now, reclaim=True)
        return False

    def _decide(self, p: _Pod, now: float) -> Allocation | None:
        """The policy's allocation within ``p``'s permissions (a pod they kept from room
        elsewhere is noted)."""
        allocation = self.decider.decide(p.request, now)
        if allocation is None:
            self.limits.kept_out(p.key, p.request, self.decider)
        return allocation

    def _may_evict(self, group: str) -> bool:
        """Not while pods evicted for ``group`` are still leaving (they would be counted
        twice)."""
        return self.awaiting.get(group, 0) == 0

    def _evicting(self, group: str) -> bool:
        """Whether pods of ``group``'s cohort are leaving to make room for one of its
        members (borrowers wait, or they would take the room being made)."""
        return any(self.awaiting.get(m.name, 0) for m in self.cohort.peers(group))

    def _fair(self, group: str) -> bool:
        return self.cohort.member(group).cohort in self.tenancy.fair

    def _capped(self, p: _Pod, amount: Amount) -> bool:
        """Whether borrowing ``amount`` would take ``p``'s group beyond its fair share."""
        assert p.group is not None
        return self._fair(p.group) and capped(self.cohort, p.group, amount,
                                              self.waiting.but(p.group, p.lower_bound))

    def _reclaim_for_fairness(self, p: _Pod, now: float) -> bool:
        """Evict borrowed pods of the groups beyond their fair share for ``p`` (within its
        own, refused because the cohort lent everything out); False: not the case."""
        assert p.group is not None
        if not self._fair(p.group):
            return False
        victims = fairness_victims(self.cohort, p.group, p.lower_bound,
                                   self.waiting.but(p.group, p.lower_bound), self._running(),
                                   self.state)
        if victims:
            self._evict(victims, p, now, reclaim=True, fairness=True)
        return victims is not None

    def _preempt_own(self, p: _Pod, now: float) -> None:
        assert p.group is not None
        if not any(c.priority < p.priority for c in self._running(p.group)):
            return
        need = shortfall(self.cohort, p.group, p.lower_bound)
        if need == Amount():
            return
        found = select(Quota(self.state, need), self._running(),
                       all_of(below(p.priority), in_group(p.group)))
        if isinstance(found, Selection) and found.victims:
            self._evict(found.victims, p, now, reclaim=False)

    def _reclaim_room(self, p: _Pod, now: float) -> None:
        assert p.group is not None
        peers = {m.name for m in self.cohort.peers(p.group)} - {p.group}
        running = self._running()
        lent = borrowed_keys(self.cohort, running)
        room = Room(self.state, p.request, self.decider.constraints(p.request))
        found = select(room, running, lambda c: c.key in lent and c.charge is not None
                       and c.charge.group in peers)
        if isinstance(found, Selection) and found.victims:
            self._evict(found.victims, p, now, reclaim=True)

    # -- starting and stopping -----------------------------------------------------------------
    def _start(self, p: _Pod, now: float, allocation: Allocation | None) -> bool:
        if allocation is None:
            return False
        self.state.reserve(allocation)
        amount = amount_of_allocation(allocation)
        self.limits.charge(p.key, p.request, allocation, amount, p.group)
        if p.group is not None:
            self.cohort = self.cohort.charged(p.group, amount)
            self.shares.pop(p.group, None)
            if p.k in self.reclaimed_at:
                self.tallies[p.group].back_s.append(now - self.reclaimed_at.pop(p.k))
        p.running = Candidate(allocation, p.priority, Charge(amount, p.tenant, None, p.group),
                              started_s=now)
        p.epoch += 1
        self.live[p.k] = p
        if p.started is None:
            p.started = now
            self.tallies[self._key(p)].waits.append(now - p.arrival)
        self.held[self._key(p)] += amount.gpus
        if p.duration is not None:
            heapq.heappush(self.events, (now + p.duration, LEAVE, p.k, p.epoch))
        return True

    def _stop(self, p: _Pod) -> None:
        assert p.running is not None
        self.state.release(p.key)
        self.limits.refund(p.key)
        charge = p.running.charge
        assert charge is not None
        if p.group is not None:
            self.cohort = self.cohort.refunded(p.group, charge.amount)
        self.held[self._key(p)] -= charge.amount.gpus
        p.running = None
        del self.live[p.k]

    def _evict(self, victims: tuple[Candidate, ...], lender: _Pod, now: float,
               reclaim: bool, fairness: bool = False) -> None:
        """Evict ``victims`` for ``lender``'s pod (a reclaim — of lent capacity, or for
        fairness — or a preemption inside its group's quota)."""
        group = lender.group
        assert group is not None
        for c in victims:
            v = self.by_key[c.key]
            v.leaving, v.for_group = True, group
            tally = self.tallies[self._key(v)]
            if fairness:
                tally.fair_reclaimed += 1
                self.tallies[group].fair_reclaims += 1
            elif reclaim:
                tally.reclaimed += 1
                self.tallies[group].reclaims += 1
            else:
                tally.preempted += 1
            heapq.heappush(self.events, (now + self.grace_s, RELEASE, v.k, v.epoch))
        self.awaiting[group] = self.awaiting.get(group, 0) + len(victims)
        if reclaim:
            self.reclaimed_at.setdefault(lender.k, now)

    def _running(self, group: str | None = None) -> list[Candidate]:
        """The running pods that are not leaving (of ``group`` only, when given)."""
        return [p.running for p in self.live.values() if p.running is not None and
                not p.leaving and (group is None or p.group == group)]

    # -- results -----------------------------------------------------------------------------------
    def _record(self, now: float) -> None:
        self.times.append(now)
        for key in self.keys:
            self.curve_held[key].append(self.held[key])
            borrowed = (self.cohort.borrowed(key).gpus if key in self.cohort.members else 0)
            self.curve_borrowed[key].append(borrowed)
        self.limits.record()

    def result(self, wall_s: float) -> TenantRun:
        waiting: dict[str, int] = {key: 0 for key in self.keys}
        for queue in self.queues.values():
            for _, _, k in queue:
                waiting[self._key(self.pods[k])] += 1
        nominal = {key: (self.cohort.member(key).nominal.gpus if key in self.cohort.members
                         else None) for key in self.keys}
        return TenantRun(self.policy, self.seed, self.tenancy.borrows, self.keys, nominal,
                         self.tallies, tuple(self.times),
                         {k: tuple(v) for k, v in self.curve_held.items()},
                         {k: tuple(v) for k, v in self.curve_borrowed.items()},
                         waiting, self.last_arrival, round(wall_s, 3), self.limits.tallies,
                         *self.limits.curves(), variant=self.tenancy.variant)
