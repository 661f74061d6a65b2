"""What the agent does about over-users (``--over-use-action``).

Always, when a container becomes an over-user: a WARNING log line, an Event
``GpupoolOverUse`` about its pod, the pod annotation ``gpupool.io/over-use``
(``{container: {gpu, memoryMiB, memoryLimitMiB, computePct, computeLimitPct, since}}``)
and ``gpupool_node_over_use_actions_total{action}``. Then the action:

* ``warn``: nothing more;
* ``isolate``: the GPU takes no new placements while the over-user is there — the
  agent publishes ``status.isolation: {state: Isolated, reason, pods}`` on its
  ``GPUDevice`` (the extender places nothing new on it) and refuses new slices on it
  itself; all undone when the over-user is gone;
* ``evict``: the pod is evicted through the Eviction API (policy/v1), which honours
  PodDisruptionBudgets: a refused eviction (HTTP 429) is logged, recorded as an Event
  and tried again at the next sample while the over-use lasts.

When it stops being an over-user: an Event ``GpupoolOverUseEnded``, the annotation
entry removed, isolation lifted.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from gpupool.contract import names
from gpupool.core.errors import GpupoolError
from gpupool.kube.errors import KubeError, NotFound
from gpupool.nodeagent.cluster import EventApi, EvictionApi, PodApi
from gpupool.nodeagent.metrics import NodeMetrics
from gpupool.nodeagent.overuse import Changes, OverUse
from gpupool.nodeagent.pods import Pod

log = logging.getLogger(__name__)

ANNOTATION_OVER_USE = f"{names.GROUP}/over-use"
EVENT_OVER_USE = "GpupoolOverUse"
EVENT_OVER_USE_ENDED = "GpupoolOverUseEnded"
EVENT_EVICTION_BLOCKED = "GpupoolEvictionBlocked"


class OveruseAction(StrEnum):
    WARN = "warn"
    ISOLATE = "isolate"
    EVICT = "evict"


class Actions:
    """Acts on the monitor's changes; thread-safe reads of the isolation state."""

    def __init__(self, action: OveruseAction, pods: PodApi, events: EventApi | None = None,
                 evictions: EvictionApi | None = None, metrics: NodeMetrics | None = None,
                 isolation_changed: Callable[[], None] = lambda: None,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC)):
        self.action = action
        self.pods = pods
        self.events = events
        self.evictions = evictions
        self.metrics = metrics
        self.isolation_changed = isolation_changed
        self.wall = wall
        self._lock = threading.Lock()
        self._isolating: dict[tuple[str, str, str], OverUse] = {}
        self._flagged_at: dict[tuple[str, str, str], str] = {}
        self._evicted: set[str] = set()
        self._dirty: set[str] = set()  # pod uids whose annotation is to be (re)written

    def __call__(self, changes: Changes, pods: dict[str, Pod]) -> None:
        self._evicted &= set(pods)  # forget pods that are gone
        for o in changes.started:
            self._start(o, pods.get(o.seen.pod_uid))
        for o in changes.ended:
            self._end(o, pods.get(o.seen.pod_uid))
        current = {o.seen.key: o for o in changes.current}
        self._isolate(current)
        if self.action is OveruseAction.EVICT:
            for o in changes.current:
                self._evict(o, pods.get(o.seen.pod_uid))
        for uid in sorted(self._dirty):
            self._annotate(uid, pods.get(uid), current)

    # -- start / end ---------------------------------------------------------------------
    def _start(self, o: OverUse, pod: Pod | None) -> None:
        what = o.sentence()
        log.warning("over-use past the grace period: %s; action: %s", what, self.action)
        self._flagged_at[o.seen.key] = self.wall().strftime("%Y-%m-%dT%H:%M:%SZ")
        self._dirty.add(o.seen.pod_uid)
        if self.metrics is not None:
            self.metrics.actions.labels(str(self.action)).inc()
        if pod is not None and self.events is not None:
            self.events.pod_event(pod, EVENT_OVER_USE, f"{what}; action: {self.action}")

    def _end(self, o: OverUse, pod: Pod | None) -> None:
        log.info("over-use ended: pod %s container %s on GPU %s", o.seen.pod_ref,
                 o.seen.container, o.seen.gpu_uuid)
        self._flagged_at.pop(o.seen.key, None)
        self._dirty.add(o.seen.pod_uid)
        if pod is not None and self.events is not None:
            self.events.pod_event(pod, EVENT_OVER_USE_ENDED,
                                  f"container {o.seen.container} is within its slice of GPU "
                                  f"{o.seen.gpu_uuid} again", warning=False)

    # -- the annotation ----------------------------------------------------------------------
    def _annotate(self, uid: str, pod: Pod | None, current: dict[Any, OverUse]) -> None:
        if pod is None:
            self._dirty.discard(uid)
            return
        mine = {k[1]: o for k, o in current.items() if k[0] == uid}
        value = json.dumps({c: _figures(o, self._flagged_at.get(o.seen.key, ""))
                            for c, o in sorted(mine.items())},
                           sort_keys=True, separators=(",", ":")) if mine else None
        if pod.annotations.get(ANNOTATION_OVER_USE) == value:
            self._dirty.discard(uid)
            return
        try:
            self.pods.patch_annotations(pod, {ANNOTATION_OVER_USE: value})
            self._dirty.discard(uid)
        except GpupoolError as exc:  # a conflict or an outage: written at the next sample
            log.info("over-use annotation of pod %s not written yet: %s", pod.ref, exc)

    # -- isolate ----------------------------------------------------------------------------
    def _isolate(self, current: dict[tuple[str, str, str], OverUse]) -> None:
        if self.action is not OveruseAction.ISOLATE:
            return
        with self._lock:
            before = {k[2] for k in self._isolating}
            self._isolating = dict(current)
            after = {k[2] for k in self._isolating}
        if before != after:
            log.info("isolated GPUs: %s", ", ".join(sorted(after)) or "none")
            self.isolation_changed()

    def isolation(self, uuid: str) -> dict[str, Any]:
        """``GPUDevice`` ``status.isolation`` of GPU ``uuid``."""
        with self._lock:
            mine = [o for k, o in self._isolating.items() if k[2] == uuid]
        if not mine:
            return {"state": "None", "reason": "", "pods": []}
        return {"state": names.DEVICE_ISOLATED, "reason": "; ".join(o.sentence() for o in mine),
                "pods": sorted({o.seen.pod_ref for o in mine})}

    def isolated(self) -> set[str]:
        with self._lock:
            return {k[2] for k in self._isolating}

    # -- evict --------------------------------------------------------------------------------
    def _evict(self, o: OverUse, pod: Pod | None) -> None:
        if pod is None or self.evictions is None or pod.uid in self._evicted:
            return
        try:
            self.evictions.evict(pod)
        except NotFound:
            self._evicted.add(pod.uid)
            return
        except KubeError as exc:
            blocked = exc.code == 429
            log.warning("eviction of pod %s %s: %s", pod.ref,
                        "blocked by a PodDisruptionBudget" if blocked else "failed", exc)
            if self.events is not None:
                self.events.pod_event(pod, EVENT_EVICTION_BLOCKED if blocked
                                      else EVENT_OVER_USE, f"eviction for GPU over-use "
                                      f"{'blocked' if blocked else 'failed'}: {exc}")
            return
        self._evicted.add(pod.uid)
        log.warning("evicted pod %s: %s", pod.ref, o.sentence())


def _figures(o: OverUse, since: str) -> dict[str, Any]:
    s = o.seen
    return {"gpu": s.gpu_uuid, "memoryMiB": s.memory_mib, "memoryLimitMiB": s.memory_limit_mib,
            "computePct": o.compute_pct, "computeLimitPct": s.core_limit_pct, "since": since}
