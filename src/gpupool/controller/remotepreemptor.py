"""Preemption for remote slices, the writes: Events, then evictions through the Eviction API.

``RemotePreemptor.round`` asks ``remotepreempt.RemotePlanner`` for this round's plan and
carries it out, preemptor by preemptor:

* the GPULedgers are read once per round in which some pod may preempt, before the plan:
  the planner counts their live holds (``remoteledgers``), so it plans no victims for room
  another pod's hold has taken, and offers no pod a hold displaces as a victim again; a
  round whose ledgers cannot be read plans and evicts nothing;
* a **re-drive**: a hold of a pod that may preempt, ``REDRIVE_S`` old, whose displaced
  pods still run and are not leaving (its writer, a leader that died, never sent the
  evictions): those pods are evicted now, through the same steps as below, without a
  second hold;
* the hold first (``remoteholds``): a pod that already has a live hold or a bind in a
  ledger is left alone (a second round or a new leader writes no second hold);
  otherwise its hold (``kind: hold``, ``expires`` after ``hold_s``, ``displaces`` = the
  victims) is written in the serving node's ledger by compare-and-swap after the
  extender's fit check. A conflict, no room, or an error writes nothing and evicts
  nobody: the pod is planned afresh in a later round (``unheld``, once per preemptor);
* an Event ``GpupoolRemotePreempting`` (Normal) on the preemptor naming the node, the
  victims and the serving tier;
* per victim, an Event ``GpupoolRemotePreempted`` (Warning) saying for whom, then
  ``pods/eviction`` (policy/v1) with the victim's uid as a precondition (a pod deleted and
  made again under the name is not evicted). The API server refuses with HTTP 429 while a
  PodDisruptionBudget allows no disruption: then an Event
  ``GpupoolRemotePreemptionBlocked`` and no further eviction for that preemptor this round,
  and its hold is removed (at the version written; one that cannot be removed expires);
  the victim may be chosen again after the retry time — never forced;
* a preemptor left waiting is logged once per reason (not an Event each round);
* every outcome counted (``gpupool_controller_remote_preemption_total{outcome}``):
  ``evicted``, ``blocked``, ``failed``, ``gone`` and ``deferred`` per victim,
  ``no-victims`` and ``invalid`` per pod left waiting (once per reason), ``unheld`` per
  preemptor whose hold was not written.

Once the leader's term has ended (``ended``), nothing more is sent.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from gpupool.contract.ledger import View
from gpupool.controller import podwrites, remoteledgers, remotewaiting
from gpupool.controller.observed import Observed
from gpupool.controller.remoteholds import RemoteHolds
from gpupool.controller.remotepreempt import Preemption, RemotePlanner, RoundPlan, Victim
from gpupool.controller.remotewaiting import Skip
from gpupool.core.eligibility import Catalogue
from gpupool.core.model import Labels
from gpupool.kube.controller_ops import ControllerApi
from gpupool.kube.errors import KubeError

log = logging.getLogger(__name__)

EVENT_PREEMPTING = "GpupoolRemotePreempting"
EVENT_PREEMPTED = "GpupoolRemotePreempted"
EVENT_BLOCKED = "GpupoolRemotePreemptionBlocked"


class Outcome(StrEnum):
    EVICTED = "evicted"
    BLOCKED = "blocked"  # HTTP 429: a PodDisruptionBudget
    FAILED = "failed"  # another error: tried again later
    GONE = "gone"  # already deleted (or replaced under its name)
    DEFERRED = "deferred"  # over the per-minute cap this round
    NO_VICTIMS = "no-victims"  # a preemptor no eviction could help (or may not preempt)
    INVALID = "invalid"  # a preemptor that could not be read
    UNHELD = "unheld"  # a preemptor whose hold was not written: nobody evicted this round


OUTCOMES = tuple(o.value for o in Outcome)
Tally = Callable[[str], None]


class RemotePreemptor:
    def __init__(self, api: ControllerApi, planner: RemotePlanner, tally: Tally | None = None,
                 clock: Callable[[], float] = time.time, host: str = ""):
        self.api = api
        self.planner = planner
        self.tally = tally
        self.clock = clock
        self.host = host
        self.holds = RemoteHolds(api, planner.config.hold_s)
        self._told: dict[str, str] = {}  # pod uid -> the reason last logged

    def round(self, observed: Observed, pods: Iterable[Mapping[str, Any]],
              node_labels: Mapping[str, Labels], catalogue: Catalogue | None,
              ended: threading.Event | None = None) -> RoundPlan:
        """One round of preemption for remote slices; returns the plan it carried out."""
        if ended is not None and ended.is_set():
            return RoundPlan()
        now = self.clock()
        pods = list(pods)
        views: dict[str, View] = {}
        if self._wanted(pods, now):
            try:
                views = self.holds.read()
            except KubeError as exc:
                log.warning("remote preemption waits: the GPU ledgers cannot be read: %s", exc)
                return RoundPlan()
        plan = self.planner.plan(observed, pods, node_labels, catalogue, now, views)
        bound = remotewaiting.bound(pods)
        self._tell(plan.skipped)
        for p in plan.preemptions:
            if p.deferred:
                for _ in p.victims:
                    self._count(Outcome.DEFERRED)
                log.info("remote preemption deferred (over the per-minute cap): %s",
                         p.describe())
                continue
            if ended is not None and ended.is_set():
                log.warning("the leader's term ended: remote preemption stops for this round")
                break
            held = self._hold(p, views, observed, now, bound)
            if held is not None:
                self._preempt(p, now, ended, held)
        return plan

    def _wanted(self, pods: Iterable[Mapping[str, Any]], now: float) -> bool:
        """Whether any pod may preempt now (only then are the ledgers read)."""
        config = self.planner.config
        return config.enabled and bool(remotewaiting.waiting(pods, now, config.grace_s)[0])

    def _hold(self, p: Preemption, views: dict[str, View], observed: Observed, now: float,
              bound: Collection[str]) -> View | None:
        """Write ``p``'s hold (the ledger as written), else None: nobody is evicted."""
        w = p.preemptor
        if p.written:  # a re-drive: the hold is there, its evictions were never sent
            log.warning("remote preemption: the hold of pod %s on node %s is %.0f s old and "
                        "its victims still run (its writer stopped before evicting them): "
                        "evicting them now", w.pod, p.node, remoteledgers.REDRIVE_S)
            return views.get(p.node) or View(p.node)
        where = self.holds.holding(views, w.uid, now)
        if where is not None:
            log.info("remote preemption: pod %s has room held or is bound on node %s "
                     "already: nobody evicted for it", w.pod, where)
            return None
        written = self.holds.write(p, views.get(p.node) or View(p.node), observed, now,
                                   bound)
        if written.view is None:
            self.planner.unpromise(w.uid)
            self._count(Outcome.UNHELD)
            log.info("remote preemption for pod %s not carried out (planned again later): %s",
                     w.pod, written.why)
            if written.conflict:  # read again before another hold on that node this round
                try:
                    views[p.node] = self.holds.fetch(p.node)
                except KubeError as exc:
                    log.warning("reading the GPU ledger of %s: %s", p.node, exc)
            return None
        views[p.node] = written.view
        return written.view

    def _preempt(self, p: Preemption, now: float, ended: threading.Event | None,
                 held: View) -> None:
        w = p.preemptor
        log.warning("remote preemption: %s", p.describe())
        self._event(w.namespace, w.name, w.uid, EVENT_PREEMPTING, p.describe(), False)
        for v in p.victims:
            if ended is not None and ended.is_set():
                return
            if not self._evict(p, v, now):
                if not self.holds.remove(held, w.uid):
                    log.info("the hold of pod %s on node %s stays until it expires",
                             w.pod, p.node)
                return  # refused: the rest waits for a plan made again later

    def _evict(self, p: Preemption, v: Victim, now: float) -> bool:
        w = p.preemptor
        self._event(v.namespace, v.name, v.uid, EVENT_PREEMPTED,
                    f"evicted by gpupool to make room for the remote GPU slice of pod {w.pod} "
                    f"(priority {w.priority}, higher than this pod's {v.priority}) on node "
                    f"{v.node}", True)
        done, exc = podwrites.evict(self.api, v.namespace, v.name, v.uid)
        outcome = Outcome(done)
        if exc is not None:
            retry = self.planner.config.retry_s
            log.warning("remote preemption: eviction of pod %s %s (tried again in %.0f s at "
                        "the earliest): %s", v.pod, "blocked by a PodDisruptionBudget"
                        if outcome is Outcome.BLOCKED else "failed", retry, exc)
            self._event(v.namespace, v.name, v.uid, EVENT_BLOCKED,
                        f"eviction for the remote GPU slice of pod {w.pod} refused; not "
                        f"forced, tried again in {retry:.0f} s at the earliest: {exc}", True)
        self.planner.record(v, outcome is Outcome.EVICTED, outcome is Outcome.GONE, now)
        self._count(outcome)
        return outcome in (Outcome.EVICTED, Outcome.GONE)

    def _tell(self, skipped: Iterable[Skip]) -> None:
        seen = {}
        for s in skipped:
            seen[s.uid] = s.reason
            if self._told.get(s.uid) == s.reason:
                continue
            log.info("remote preemption: pod %s waits: %s", s.pod, s.reason)
            self._count(Outcome.INVALID if s.invalid else Outcome.NO_VICTIMS)
        self._told = seen

    def _event(self, namespace: str, name: str, uid: str, reason: str, message: str,
               warning: bool) -> None:
        podwrites.tell(self.api, namespace, name, uid, reason, message[:1024], warning,
                       self.host, datetime.fromtimestamp(self.clock(), UTC))

    def _count(self, outcome: Outcome) -> None:
        if self.tally is not None:
            self.tally(outcome.value)


