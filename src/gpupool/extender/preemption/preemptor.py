"""Preemption of GPU slices: making room for a pending pod by evicting pods of lower priority.

kube-scheduler's own preemption cannot see GPU slices, so its dry run never finds a victim
and the extender's preempt verb is never called (docs/design/preemption.md). The extender
preempts by itself. When filter finds no node for a GPU pod that may preempt
(``spec.preemptionPolicy`` is not ``Never``):

1. **Plan** (``planner``): filter (``consider``, under the cache lock) hands the pod to
   the planner thread and answers at once with the plain reasons. That thread takes what
   the plan needs under the lock (an ``Ask``: whole copies of the state and of the pod
   facts, the PodDisruptionBudgets), then has the core choose without it
   (``core.victims.select`` with ``Room``) among the nodes kube-scheduler sent, with the
   constraints filter worked out. Candidates are the pods gpupool placed there (counted
   decisions), eligible when of strictly lower priority and not displaced by another
   preemption already; pods being deleted count as free. Then, under the lock again, the
   plan counts only if it still holds on the live state (``planner.recheck``: the victims
   are still there and eligible, the pod still fits nowhere without them, and the placement
   policy finds it a place on that node once they are gone); a stale plan is made once
   more, then left to the pod's next filter. A plan inside a tenant's quota
   (``tenantpreempt``) takes the same three steps, its quotas' needs taken with the ask
   and its victims chosen anywhere in the cluster.
2. **Hold, then evict** (``carry_out``, one worker thread): a compare-and-swap on the node's
   GPULedger writes the pod's *hold* (kind ``hold``, ``expires``, ``displaces`` = the
   victims), checked to fit the node with the victims counted out; the CAS is where two
   replicas agree, so one room is never made twice. Then each victim is evicted through
   the Eviction API (with its UID as precondition). A refusal (a PodDisruptionBudget's 429,
   or any error) stops there: the hold is removed and the pod gets a Warning Event. Each
   evicted victim gets a ``Preempted`` Event, the pod a ``GpupoolPreempting`` one.
3. **Use the room**: the pod's next filter finds its plan or hold: while the victims leave, that
   node's reason says so; then the pod fits there (filter sets its own hold aside) and
   prioritize ranks that node first; its bind replaces the hold with its decision.

A hold expires ``hold_s`` after it was written (the room is then anyone's, and the pod may
plan again: pods still leaving count as free, so nothing is evicted twice); a pod that
goes away or is bound elsewhere releases its hold at once (``commitments``). A pod whose
plan found no victims, or whose preemption failed, waits ``retry_s`` before planning again.
A pod that fits a node kube-scheduler did not send (it sends a rotating window of the
nodes) is left to the next window, unless that keeps happening (``ELSEWHERE_CYCLES``). A
hold whose victims still run ``REDRIVE_S`` after it was written (its replica stopped
between the hold and the evictions) has its evictions carried out by whichever replica
filters the pod next.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from gpupool.core.errors import OverCommit
from gpupool.core.fit import Constraints
from gpupool.core.request import PodRequest
from gpupool.core.victims import NoVictims
from gpupool.extender.metrics import Metrics
from gpupool.extender.preemption import planner, tenantpreempt
from gpupool.extender.preemption.plans import Plan, PreemptionSettings, Victim, stamp
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.state.ledger import HOLD, Entry, FitCheck, Ledgers, View, counted
from gpupool.extender.state.pods import PodFacts
from gpupool.extender.wire.podspec import may_preempt, pod_id, pod_priority
from gpupool.kube.api import KubeApi
from gpupool.kube.errors import Conflict, KubeError, NotFound

log = logging.getLogger(__name__)

COMPONENT = "gpupool-extender"
ELSEWHERE_CYCLES = 3
REDRIVE_S = 30.0  # a hold this old whose victims do not leave lost its evictions
REMEMBERED = 4096


class Preemptor:
    """Takes an ask in filter (``consider``), plans on its planner thread, carries out on
    its worker thread."""

    def __init__(self, cache: ClusterCache, kube: KubeApi, metrics: Metrics,
                 settings: PreemptionSettings, clock: Callable[[], float], decide: planner.Decide,
                 choose: planner.Choose = planner.choose):
        self.cache = cache
        self.kube = kube
        self.metrics = metrics
        self.settings = settings
        self.clock = clock
        self.decide = decide
        self.choose = choose  # the pure planner (a parameter: tests slow it down)
        self.ledgers = Ledgers(kube)
        self.fits = FitCheck()
        self.inflight: dict[str, Plan] = {}  # pod uid -> the plan being carried out
        self.retry_at: dict[str, float] = {}  # pod uid -> when it may plan again
        self.elsewhere: dict[str, int] = {}  # pod uid -> cycles it fit only unsent nodes
        self.planning: set[str] = set()  # pod uids whose plan is being made
        self.planners = ThreadPoolExecutor(1, thread_name_prefix="extender-plan")
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="extender-preempt")

    def close(self) -> None:
        self.planners.shutdown(wait=True, cancel_futures=True)
        self.worker.shutdown(wait=True, cancel_futures=True)

    # -- considering (in filter, under the cache lock) ------------------------------------------
    def consider(self, pod: Mapping[str, Any], request: PodRequest, constraints: Constraints,
                 rows: Sequence[int], elsewhere: bool = False) -> dict[str, str]:
        """Node -> why it is the one to wait for: room being made there for this pod (an
        empty dict: nothing to say). Starts a preemption when it should. ``elsewhere``: the
        pod fits a node kube-scheduler did not send; it preempts only after being sent no
        such node ``ELSEWHERE_CYCLES`` times (kube-scheduler sends a rotating window of
        the nodes, and rules some out for reasons of its own)."""
        key = request.key
        plan = self.inflight.get(key)
        if plan is not None:
            return {plan.node: plan.note()}
        now = self.clock()
        held = self.cache.live_hold(key)
        if held is not None:
            self._redrive(pod, request, *held, now)
            return {held[0]: self._waiting(held[1])}
        if not self.settings.enabled or not request.gpus or not may_preempt(pod) or \
                "budgets" not in self.cache.synced or self.retry_at.get(key, 0.0) > now or \
                key in self.planning or self._room_elsewhere(key, elsewhere):
            return {}
        want = planner.want_of(pod, request, constraints, self.cache.state, rows,
                               self.settings.limits, self._quota_full(request, constraints))
        self.planning.add(key)
        try:
            self.planners.submit(self._plan, want)
        except RuntimeError:  # closed: the extender is stopping
            self.planning.discard(key)
        return {}

    def _started(self, plan: Plan) -> dict[str, str]:
        """Carry out ``plan`` (under the cache lock)."""
        self.inflight[plan.uid] = plan
        self.metrics.preemptions.labels("started").inc()
        self.worker.submit(self.carry_out, plan)
        return {plan.node: plan.note()}

    def _none(self, key: str, found: NoVictims) -> dict[str, str]:
        self._retry_later(key, self.clock())
        self.metrics.preemptions.labels("no-victims").inc()
        log.info("no preemption for %s: %s", key, found.message)
        return {}

    # -- planning (the planner thread, off the cache lock) --------------------------------------
    def _plan(self, want: planner.Want, first: bool = True) -> None:
        """Take an ask under the lock, choose the victims without it, then commit the plan
        under it if it still holds (``planner.recheck``); a stale plan is made once more
        from a fresh ask, then left to the pod's next filter."""
        try:
            with self.cache.lock:
                self.cache.flush()
                ask = planner.take(self.cache, want)
                if isinstance(ask, NoVictims):
                    self._none(want.key, ask)
            if not isinstance(ask, planner.Ask):
                return
            chosen = self.choose(ask)
            with self.cache.lock:
                self.cache.flush()
                if isinstance(chosen, NoVictims):
                    self._none(want.key, chosen)
                    return
                found = planner.recheck(self.cache, self.decide, ask, chosen)
                if isinstance(found, Plan):
                    self._counted(want, found)
                    self._started(found)
                    return
                again = first and planner.pending(self.cache, want.key)
                self.metrics.stale_plans.labels("replanned" if again else "dropped").inc()
                log.info("the preemption plan for %s/%s went stale: %s", want.namespace,
                         want.name, found)
            if again:
                self._plan(want, first=False)
        except Exception:  # the planner must survive anything; the pod plans again later
            log.exception("planning a preemption for %s/%s", want.namespace, want.name)
            with self.cache.lock:
                self._retry_later(want.key, self.clock())
        finally:
            if first:
                with self.cache.lock:
                    self.planning.discard(want.key)

    def _redrive(self, pod: Mapping[str, Any], request: PodRequest, node: str, entry: Entry,
                 now: float) -> None:
        """A hold older than ``REDRIVE_S`` whose victims still run and are not leaving: the
        replica that wrote it stopped before evicting them (it crashed); evict them now."""
        written = entry.bind_s
        if written is None or now - written < REDRIVE_S or self.retry_at.get(
                request.key, 0.0) > now:
            return
        victims = []
        for uid in entry.displaces:
            f = self.cache.pods.get(uid)
            if f is not None and not f.leaving and _serving(f) == node:
                victims.append(Victim(uid, f.namespace, f.name, f.priority))
        if not victims:
            return
        ident = pod_id(pod)
        plan = Plan(request.key, ident.namespace, ident.name, pod_priority(pod), node,
                    entry.allocation, tuple(victims), (), request, entry.group, written=True)
        self.inflight[request.key] = plan
        self.worker.submit(self.carry_out, plan)

    def _retry_later(self, key: str, now: float) -> None:
        self.retry_at[key] = now + self.settings.retry_s
        if len(self.retry_at) > REMEMBERED:  # forget the waits that are over
            self.retry_at = {k: t for k, t in self.retry_at.items() if t > now}

    def _room_elsewhere(self, key: str, elsewhere: bool) -> bool:
        """Whether to leave the pod to kube-scheduler's next window of nodes."""
        if not elsewhere:
            self.elsewhere.pop(key, None)
            return False
        seen = self.elsewhere.pop(key, 0) + 1
        if seen >= ELSEWHERE_CYCLES:
            return False
        self.elsewhere[key] = seen
        while len(self.elsewhere) > REMEMBERED:
            self.elsewhere.pop(next(iter(self.elsewhere)))
        return True

    def _waiting(self, entry: Entry) -> str:
        left = sum(1 for v in entry.displaces if v in self.cache.pods)
        if not left:
            return "making room here: the freed GPU slices are held for this pod"
        return (f"making room here: waiting for {left} preempted pod"
                f"{'s' if left > 1 else ''} to leave; their GPU slices are held for this pod")

    def _quota_full(self, request: PodRequest, constraints: Constraints) -> bool:
        """Refused by a tenant quota that the tenant's own pods going could satisfy."""
        return tenantpreempt.is_quota_refusal(constraints) and bool(
            self.cache.catalogue.tenants.covering(request.tenant))

    def _counted(self, want: planner.Want, plan: Plan) -> None:
        """A tenant quota's plan counts per tenant and kind (priority or reclaim)."""
        if want.quota:
            tenant = self.cache.catalogue.tenants.tenant_of(want.request.tenant) or ""
            self.metrics.tenant_preemptions.labels(tenant, tenantpreempt.kind_of(plan)).inc()

    # -- carrying out (the worker thread) ----------------------------------------------------
    def carry_out(self, plan: Plan) -> None:
        try:
            if plan.written or self._write_hold(plan):
                self._evict(plan)
        except Exception:  # the worker must survive anything; the pod plans again later
            log.exception("preempting for %s/%s", plan.namespace, plan.name)
            self._give_up(plan, "failed", "an internal error")
        finally:
            with self.cache.lock:
                self.inflight.pop(plan.uid, None)

    def _write_hold(self, plan: Plan) -> bool:
        now = self.clock()
        entry = Entry(plan.hold, f"{plan.namespace}/{plan.name}", stamp(now),
                      plan.request.tenant, plan.request.gpu_class, plan.group, HOLD,
                      stamp(now + self.settings.hold_s), plan.displaces)
        for _ in range(self.settings.attempts):
            with self.cache.lock:
                self.cache.flush()
                why = self._stale(plan)
                view = self.cache.ledgers.get(plan.node) or View(plan.node)
                prune = self.cache.prunable(view)
                where = self.cache.state.nodes[self.cache.state.index[plan.node]] \
                    if plan.node in self.cache.state.index else None
            if why or where is None:
                self._give_up(plan, "abandoned", why or f"node {plan.node} is gone", event=False)
                return False
            gone = set(entry.displaces)
            try:
                held = [a for a in counted(view, prune) if a.key not in gone]
                self.fits.check(where, held, plan.hold, self.cache.state.memory_unit_mib)
                written = self.ledgers.commit(view, plan.uid, entry, prune)
                self.cache.ledger_update(written)
                return self._kept(plan, written)
            except (OverCommit, Conflict):
                self.metrics.conflicts.inc()
                self._refresh(plan.node)
            except KubeError as exc:
                self._give_up(plan, "failed", f"writing the GPU ledger of {plan.node}: {exc}")
                return False
        self._give_up(plan, "abandoned", f"the GPU ledger of {plan.node} kept changing",
                      event=False)
        return False

    def _kept(self, plan: Plan, written: View) -> bool:
        """Whether the API server stored the hold as one: a GPULedger CRD without the
        ``kind``, ``expires`` and ``displaces`` fields prunes them (apply
        deploy/crds/gpuledgers.yaml); the entry is then removed and nobody evicted."""
        stored = written.entries.get(plan.uid)
        if stored is not None and stored.is_hold:
            return True
        log.error("the GPULedger CRD dropped the fields of a hold: apply the gpuledgers CRD "
                  "of this version (deploy/crds/gpuledgers.yaml); nobody is evicted")
        try:
            self.ledgers.prune(written, [plan.uid])
        except KubeError as exc:  # it goes stale as a bind entry of a pending pod anyway
            log.warning("removing %s from the GPU ledger of %s: %s", plan.uid, plan.node, exc)
        self._give_up(plan, "failed", "the GPULedger resource cannot store a hold (its "
                      "CRD is older than this extender)")
        return False

    def _stale(self, plan: Plan) -> str:
        """Why the plan no longer holds ('' when it does), under the cache lock."""
        cache = self.cache
        f = cache.pods.get(plan.uid)
        if plan.uid in cache.finished or (f is not None and f.node):
            return "the pod is gone or bound"
        held = cache.live_hold(plan.uid)
        if held is not None:
            return f"room is being made for it on {held[0]} already"
        displaced = cache.displaced()
        for v in plan.victims:
            g = cache.pods.get(v.uid)
            if g is None or v.uid in cache.finished or (_serving(g) != plan.node and
                                                         not plan.anywhere):
                return f"pod {v.namespace}/{v.name} is gone or elsewhere"
            if v.uid in displaced:
                return f"pod {v.namespace}/{v.name} is being preempted for another pod"
        return ""

    def _refresh(self, node: str) -> None:
        try:
            self.cache.ledger_update(self.ledgers.fetch(node))
        except KubeError as exc:
            log.warning("reading the GPU ledger of %s: %s", node, exc)

    def _evict(self, plan: Plan) -> None:
        for v in plan.victims:
            with self.cache.lock:
                f = self.cache.pods.get(plan.uid)
                gone = plan.uid in self.cache.finished or (f is not None and bool(f.node))
            if gone:  # the pod went away (or was bound) meanwhile: evict nobody more (its
                # hold holds nothing now; the reconciler removes it)
                self._give_up(plan, "abandoned", "the pod is gone or bound", event=False)
                return
            try:
                self.kube.evict_pod_of(v.namespace, v.name, v.uid)
            except NotFound:
                continue  # gone already
            except KubeError as exc:
                self._remove_hold(plan)
                self._give_up(plan, "refused", f"evicting {v.namespace}/{v.name}: {exc}")
                return
            self.metrics.preempted.inc()
            self.event(v.namespace, v.name, v.uid, "Preempted", False,
                        f"Preempted by pod {plan.namespace}/{plan.name} (priority "
                        f"{plan.priority}) on node {plan.node}: gpupool frees its GPU slices "
                        "for a pod of higher priority")
        self.metrics.preemptions.labels("held").inc()
        names = ", ".join(v.describe() for v in plan.victims) or "none (pods already leaving)"
        self.event(plan.namespace, plan.name, plan.uid, "GpupoolPreempting", False,
                    f"making room on node {plan.node}: evicted {names}; the freed GPU slices "
                    f"are held for this pod for {self.settings.hold_s:.0f}s")
        log.info("preempting for %s/%s on %s: %s", plan.namespace, plan.name, plan.node, names)

    def _remove_hold(self, plan: Plan) -> None:
        """Remove the pod's hold, only while it is one (at the version read: a bind may
        have replaced it meanwhile); a hold left behind expires anyway."""
        for _ in range(self.settings.attempts):
            with self.cache.lock:
                view = self.cache.ledgers.get(plan.node)
            entry = view.entries.get(plan.uid) if view is not None else None
            if view is None or entry is None or not entry.is_hold:
                return
            try:
                self.cache.ledger_update(self.ledgers.prune(view, [plan.uid]))
                return
            except (Conflict, NotFound):
                self._refresh(plan.node)
            except KubeError as exc:
                log.warning("removing the hold of %s from the GPU ledger of %s: %s",
                            plan.uid, plan.node, exc)
                return

    def _give_up(self, plan: Plan, outcome: str, why: str, event: bool = True) -> None:
        self.metrics.preemptions.labels(outcome).inc()
        with self.cache.lock:
            self._retry_later(plan.uid, self.clock())
        log.info("preemption for %s/%s on %s %s: %s", plan.namespace, plan.name, plan.node,
                 outcome, why)
        if event:
            self.event(plan.namespace, plan.name, plan.uid, "GpupoolPreemptionFailed", True,
                        f"could not make room on node {plan.node}: {why}; gpupool tries "
                        f"again in {self.settings.retry_s:.0f}s")

    def event(self, namespace: str, name: str, uid: str, reason: str, warning: bool,
               message: str) -> None:
        try:
            self.kube.create_pod_event(namespace, name, uid, reason, message, warning,
                                       COMPONENT, self.settings.instance or COMPONENT,
                                       datetime.fromtimestamp(self.clock(), UTC))
        except KubeError as exc:
            log.warning("recording Event %s on %s/%s: %s", reason, namespace, name, exc)


def _serving(f: PodFacts) -> str:
    """The node whose GPUs a placed pod holds: its own, or its remote slice's server's."""
    return f.decision.gpu_node if f.decision is not None else f.node
