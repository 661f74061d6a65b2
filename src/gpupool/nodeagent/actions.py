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
  and tried again at the next sample while the over-use lasts;
* ``pause``: the over-user is isolated as a *workload*, the rest of the GPU serving on:
  its container is frozen (cgroup v2 freezer, ``freezer.Freezer``: Event
  ``GpupoolPaused``) while the over-use lasts and thawed when it ends (Event
  ``GpupoolResumed``). Frozen, it uses no compute, so a compute over-user's mean falls
  back within its share and it runs again (paused again after the grace if it goes on:
  its compute is cut to about its share); a memory over-user keeps its memory while
  frozen and stays paused until it is deleted. A container that cannot be frozen (cgroup
  v1, no write access) is logged and recorded as an Event; nothing else is done.

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
from pathlib import Path
from typing import Any

from gpupool.contract import names
from gpupool.core.errors import GpupoolError
from gpupool.kube.errors import KubeError, NotFound
from gpupool.nodeagent.cluster import EventApi, EvictionApi, PodApi
from gpupool.nodeagent.freezer import Freezer
from gpupool.nodeagent.metrics import NodeMetrics
from gpupool.nodeagent.overuse import Changes, OverUse
from gpupool.nodeagent.pods import Pod

log = logging.getLogger(__name__)

ANNOTATION_OVER_USE = f"{names.GROUP}/over-use"
EVENT_OVER_USE = "GpupoolOverUse"
EVENT_OVER_USE_ENDED = "GpupoolOverUseEnded"
EVENT_EVICTION_BLOCKED = "GpupoolEvictionBlocked"
EVENT_PAUSED = "GpupoolPaused"
EVENT_RESUMED = "GpupoolResumed"


class OveruseAction(StrEnum):
    WARN = "warn"
    ISOLATE = "isolate"
    EVICT = "evict"
    PAUSE = "pause"


class Actions:
    """Acts on the monitor's changes; thread-safe reads of the isolation state."""

    def __init__(self, action: OveruseAction, pods: PodApi, events: EventApi | None = None,
                 evictions: EvictionApi | None = None, metrics: NodeMetrics | None = None,
                 isolation_changed: Callable[[], None] = lambda: None,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC),
                 freezer: Freezer | None = None):
        self.action = action
        self.freezer = freezer or Freezer()
        self._paused: dict[Path, set[tuple[str, str, str]]] = {}  # cgroup -> over-use keys
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
        if self.action is OveruseAction.PAUSE:
            self._pause(changes, pods)
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


    # -- pause -------------------------------------------------------------------------------
    def _pause(self, changes: Changes, pods: dict[str, Pod]) -> None:
        over = {o.seen.key for o in changes.current}
        ended = {o.seen.key: o for o in changes.ended}
        for cgroup, keys in list(self._paused.items()):
            done = keys - over
            keys &= over
            if not keys:  # no over-use left in the container: let it run
                del self._paused[cgroup]
                self._freeze(cgroup, False, next((ended[k] for k in done if k in ended),
                                                 None), pods)
        held = {k for keys in self._paused.values() for k in keys}
        for o in changes.current:
            if o.seen.key in held or not o.seen.pids:
                continue
            try:
                cgroup = self.freezer.cgroup_of(o.seen.pids[0])
            except GpupoolError as exc:
                log.warning("cannot pause pod %s container %s: %s", o.seen.pod_ref,
                            o.seen.container, exc)
                continue
            if cgroup not in self._paused and self._freeze(cgroup, True, o, pods):
                self._paused[cgroup] = set()
            if cgroup in self._paused:
                self._paused[cgroup].add(o.seen.key)

    def _freeze(self, cgroup: Path, on: bool, o: OverUse | None, pods: dict[str, Pod]
                ) -> bool:
        pod = pods.get(o.seen.pod_uid) if o is not None else None
        try:
            self.freezer.set(cgroup, on)
        except GpupoolError as exc:
            log.warning("cannot %s %s: %s", "pause" if on else "resume", cgroup, exc)
            if on and pod is not None and self.events is not None:
                self.events.pod_event(pod, EVENT_OVER_USE, f"pausing the container failed: "
                                                           f"{exc}")
            return False
        log.warning("%s %s", "paused" if on else "resumed", cgroup)
        if o is not None and pod is not None and self.events is not None:
            if on:
                self.events.pod_event(pod, EVENT_PAUSED, f"container {o.seen.container} "
                                                         f"paused (cgroup freezer): "
                                                         f"{o.sentence()}")
            else:
                self.events.pod_event(pod, EVENT_RESUMED, f"container {o.seen.container} "
                                                          "resumed: within its slice again",
                                      warning=False)
        return True

    def paused(self) -> set[Path]:
        """The cgroups this agent holds frozen now."""
        return set(self._paused)

    def resume_all(self) -> None:
        """Thaw every container this agent froze (the agent stops)."""
        for cgroup in list(self._paused):
            del self._paused[cgroup]
            self._freeze(cgroup, False, None, {})


def _figures(o: OverUse, since: str) -> dict[str, Any]:
    s = o.seen
    return {"gpu": s.gpu_uuid, "memoryMiB": s.memory_mib, "memoryLimitMiB": s.memory_limit_mib,
            "computePct": o.compute_pct, "computeLimitPct": s.core_limit_pct, "since": since}
