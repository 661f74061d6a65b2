"""What the usage monitor says about bursts (``nodeagent.burst``): logs, Events, metrics.

Each sample, ``BurstWatch.judge`` runs the burst tracker on the monitor's observations
and reports what changed:

* a burst granted: an INFO log line, an Event ``GpupoolBurst`` (Normal) about the pod,
  ``gpupool_node_bursts_total``;
* a burst reclaimed: a WARNING log line, an Event ``GpupoolBurstReclaimed`` (Warning) saying
  which GPU needed how much room and what follows, ``gpupool_node_burst_reclaims_total
  {resource}``;
* every sample: ``gpupool_node_container_burst_memory_mib`` (memory held above the
  request; 0 when none).

It returns the observations with reclaimed limits cut to the request, which the over-use
tracker then judges: the configured over-use action is what reclaims the room.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gpupool.nodeagent.burst import BurstChanges, BurstTracker
from gpupool.nodeagent.cluster import EventApi
from gpupool.nodeagent.gpu import GpuUsage
from gpupool.nodeagent.metrics import NodeMetrics
from gpupool.nodeagent.overuse import Observation
from gpupool.nodeagent.pods import Pod

log = logging.getLogger(__name__)

EVENT_BURST = "GpupoolBurst"
EVENT_BURST_RECLAIMED = "GpupoolBurstReclaimed"


@dataclass
class BurstWatch:
    """The burst tracker with what it needs: each GPU's memory, where to report."""

    tracker: BurstTracker
    memory_of: Callable[[], Mapping[str, int]]  # GPU uuid -> memory in MiB
    action: str  # the over-use action, named in reclaim Events
    grace_s: float
    events: EventApi | None = None
    metrics: NodeMetrics | None = None
    last: BurstChanges = field(default_factory=BurstChanges)

    def judge(self, now: float, seen: Sequence[Observation], usage: Sequence[GpuUsage],
              pods: Mapping[str, Pod]) -> list[Observation]:
        judged, changes = self.tracker.update(now, seen, usage, self.memory_of())
        self.last = changes
        self._report(changes, pods)
        if self.metrics is not None:
            above = {b.seen.key: b.memory_mib for b in changes.current}
            for o in seen:
                ns, _, name = o.pod_ref.partition("/")
                self.metrics.c_burst.labels(ns, name, o.container, o.gpu_uuid).set(
                    above.get(o.key, 0))
        return judged

    def _report(self, changes: BurstChanges, pods: Mapping[str, Pod]) -> None:
        for b in changes.granted:
            what = b.sentence()
            log.info("burst granted: %s", what)
            if self.metrics is not None:
                self.metrics.bursts.inc()
            self._event(pods.get(b.seen.pod_uid), EVENT_BURST,
                        f"{what}; the part above the request lasts while the GPU has room",
                        warning=False)
        for r in changes.reclaimed:
            what = (f"{r.sentence()}; unless it comes back within its request, the over-use "
                    f"action ({self.action}) applies after {self.grace_s:g} s")
            log.warning("burst reclaimed: %s", what)
            if self.metrics is not None:
                self.metrics.burst_reclaims.labels(str(r.resource)).inc()
            self._event(pods.get(r.burst.seen.pod_uid), EVENT_BURST_RECLAIMED, what)

    def _event(self, pod: Pod | None, reason: str, message: str, warning: bool = True) -> None:
        if pod is not None and self.events is not None:
            self.events.pod_event(pod, reason, message, warning=warning)
