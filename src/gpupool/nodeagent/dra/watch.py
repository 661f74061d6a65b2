"""The usage monitor's thread on a DRA node, and what it needs (``DraGuards``).

Built by ``DraAgent`` when it is given ``DraGuards``: every ``monitor.period_s`` one
sample (``UsageMonitor.sample_once`` with the grants of the prepared claims,
``usage.attribution``), its changes handed to ``Actions`` (warn / isolate / evict, the
Events, the annotation, the metrics). An isolated GPU is refused to new claims by the
preparer and shown in its ``GPUDevice``'s ``status.isolation``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from gpupool.core.errors import GpupoolError
from gpupool.nodeagent.actions import Actions, OveruseAction
from gpupool.nodeagent.cluster import EventApi, EvictionApi
from gpupool.nodeagent.dra.checkpoint import PreparedClaim
from gpupool.nodeagent.dra.pods import ClaimPods
from gpupool.nodeagent.dra.usage import attribution
from gpupool.nodeagent.gpu import GpuUsage
from gpupool.nodeagent.metrics import NodeMetrics
from gpupool.nodeagent.monitor import MonitorConfig, UsageMonitor
from gpupool.nodeagent.overuse import OveruseConfig, OveruseTracker
from gpupool.nodeagent.verify import DecisionGate

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DraGuards:
    """The usage monitor of a DRA node: its pods, settings and where it reports."""

    pods: ClaimPods
    monitor: MonitorConfig
    overuse: OveruseConfig = field(default_factory=OveruseConfig)
    action: OveruseAction = OveruseAction.WARN
    events: EventApi | None = None
    evictions: EvictionApi | None = None
    metrics: NodeMetrics | None = None


class ClaimWatch:
    """Samples usage against the prepared claims until ``stop``."""

    def __init__(self, guards: DraGuards, usage: Callable[[], Sequence[GpuUsage]],
                 claims: Callable[[], Iterable[PreparedClaim]],
                 isolation_changed: Callable[[], None]):
        g = self.guards = guards
        self.actions = Actions(g.action, g.pods, g.events, g.evictions, g.metrics,
                               isolation_changed)
        node = g.monitor.node
        self.monitor = UsageMonitor(
            g.monitor, usage, lambda: g.pods.node_pods(node, fresh=False),
            DecisionGate(node, None), OveruseTracker(g.overuse), self.actions, g.metrics,
            attribution=attribution(g.monitor.proc_root, claims, g.pods.uses))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="usage-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=3)

    def _loop(self) -> None:
        period = self.guards.monitor.period_s
        while not self._stop.wait(period):
            try:
                self.monitor.sample_once()
            except GpupoolError as exc:
                log.warning("usage sample failed (next one in %.0f s): %s", period, exc)
            except Exception:  # a bug must not end monitoring for the agent's lifetime
                log.exception("usage sample failed unexpectedly (next one in %.0f s)", period)
