"""Healing's writes: an Event about each pod, then its eviction through the Eviction API.

``Evictor.heal`` asks ``healing.Healer`` for this round's plan and carries it out:

* an Event ``GpupoolHealing`` (Warning) saying why, then ``pods/eviction`` (policy/v1)
  with the pod's uid as a precondition (a pod deleted and made again under the name is
  not evicted); the API server refuses with HTTP 429 while a PodDisruptionBudget allows
  no disruption: then an Event ``GpupoolHealingBlocked`` and a retry in a later round;
* an Event ``GpupoolHealingSkipped`` (Normal) once for a pod that opts out;
* every outcome counted (``gpupool_controller_healing_total{cause, outcome}``).

Once the leader's term has ended (``ended``), nothing more is sent.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from gpupool.contract.devices import DeviceRecord, read_device
from gpupool.controller import podwrites
from gpupool.controller.healing import Cause, Eviction, Healer, HealingPlan, Outcome
from gpupool.controller.observed import Observed
from gpupool.core.errors import InvalidInput
from gpupool.kube.controller_ops import ControllerApi

log = logging.getLogger(__name__)

EVENT_HEALING = "GpupoolHealing"
EVENT_BLOCKED = "GpupoolHealingBlocked"
EVENT_SKIPPED = "GpupoolHealingSkipped"

Tally = Callable[[Cause, Outcome], None]


class Evictor:
    def __init__(self, api: ControllerApi, healer: Healer, tally: Tally | None = None,
                 clock: Callable[[], float] = time.time, host: str = ""):
        self.api = api
        self.healer = healer
        self.tally = tally
        self.clock = clock
        self.host = host

    def heal(self, devices: Iterable[Mapping[str, Any]], observed: Observed,
             pods: Iterable[Mapping[str, Any]], ended: threading.Event | None = None
             ) -> HealingPlan:
        """One round of healing; returns the plan it carried out."""
        now = self.clock()
        by_uid = {str((p.get("metadata") or {}).get("uid") or ""): p for p in pods}
        plan = self.healer.plan(_records(devices), observed.holdings, by_uid, now)
        for e in plan.opted_out:
            self._event(e, EVENT_SKIPPED, f"not evicted to heal ({e.reason}): the pod says "
                                          "gpupool.io/healing: off", warning=False)
            self._count(e.cause, Outcome.OPTED_OUT)
        for e in plan.deferred:
            self._count(e.cause, Outcome.DEFERRED)
        for e in plan.evict:
            if ended is not None and ended.is_set():
                log.warning("the leader's term ended: healing stops for this round")
                break
            self._evict(e, now)
        return plan

    def _evict(self, e: Eviction, now: float) -> None:
        self._event(e, EVENT_HEALING, f"evicting the pod to place it again: {e.reason}")
        done, exc = podwrites.evict(self.api, e.namespace, e.name, e.uid)
        outcome = Outcome(done)
        if exc is not None:
            log.warning("healing: eviction of pod %s/%s %s (tried again in %.0f s): %s",
                        e.namespace, e.name, "blocked by a PodDisruptionBudget"
                        if outcome is Outcome.BLOCKED else "failed",
                        self.healer.config.retry_s, exc)
            self._event(e, EVENT_BLOCKED, f"eviction refused, tried again later: {exc}")
        if outcome is Outcome.EVICTED:
            log.warning("healing: evicted pod %s/%s: %s", e.namespace, e.name, e.reason)
        self.healer.record(e, outcome, now)
        self._count(e.cause, outcome)

    def _event(self, e: Eviction, reason: str, message: str, warning: bool = True) -> None:
        podwrites.tell(self.api, e.namespace, e.name, e.uid, reason, message, warning,
                       self.host, datetime.fromtimestamp(self.clock(), UTC))

    def _count(self, cause: Cause, outcome: Outcome) -> None:
        if self.tally is not None:
            self.tally(cause, outcome)


def _records(devices: Iterable[Mapping[str, Any]]) -> list[DeviceRecord]:
    out = []
    for d in devices:
        try:
            out.append(read_device(d))
        except InvalidInput:
            continue  # reported as a problem by ``observe``
    return out
