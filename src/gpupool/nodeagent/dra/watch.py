"""The usage monitor's thread on a DRA node, and what it needs (``DraGuards``).

Built by ``DraAgent`` when it is given ``DraGuards``: every ``monitor.period_s`` one
sample (``UsageMonitor.sample_once`` with the grants of the prepared claims,
``usage.attribution``), its changes handed to ``Actions`` (warn / isolate / evict, the
Events, the annotation, the metrics), then the GPU gauges (memory and compute the
prepared claims hold, their number, health, isolation). An isolated GPU is refused to
new claims by the preparer and shown in its ``GPUDevice``'s ``status.isolation``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from gpupool.nodeagent.actions import Actions, OveruseAction
from gpupool.nodeagent.cluster import EventApi, EvictionApi
from gpupool.nodeagent.dra.checkpoint import PreparedClaim, PreparedDevice
from gpupool.nodeagent.dra.pods import ClaimPods
from gpupool.nodeagent.dra.usage import attribution
from gpupool.nodeagent.freezer import Freezer
from gpupool.nodeagent.gpu import GpuInfo, GpuUsage
from gpupool.nodeagent.health import GpuReading
from gpupool.nodeagent.metrics import NodeMetrics
from gpupool.nodeagent.monitor import MonitorConfig, UsageMonitor
from gpupool.nodeagent.overuse import OveruseConfig, OveruseTracker
from gpupool.nodeagent.telemetry import TelemetryMetrics
from gpupool.nodeagent.verify import DecisionGate
from gpupool.nodeagent.workers import Workers


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
    freezer: Freezer | None = None  # ``pause``: the cgroup freezer (None: under proc_root)


class ClaimWatch:
    """Samples usage against the prepared claims until ``stop``."""

    def __init__(self, guards: DraGuards, usage: Callable[[], Sequence[GpuUsage]],
                 claims: Callable[[], Iterable[PreparedClaim]],
                 isolation_changed: Callable[[], None],
                 gpus: Callable[[], Sequence[GpuInfo]] = tuple,
                 readings: Callable[[], Sequence[GpuReading]] = tuple):
        g = self.guards = guards
        self.claims, self.gpus, self.readings = claims, gpus, readings
        self.telemetry = TelemetryMetrics(g.metrics.registry) if g.metrics is not None \
            else None
        self.actions = Actions(g.action, g.pods, g.events, g.evictions, g.metrics,
                               isolation_changed,
                               freezer=g.freezer or Freezer(g.monitor.proc_root))
        node = g.monitor.node
        self.monitor = UsageMonitor(
            g.monitor, usage, lambda: g.pods.node_pods(node, fresh=False),
            DecisionGate(node, None), OveruseTracker(g.overuse), self.actions, g.metrics,
            attribution=attribution(g.monitor.proc_root, claims, g.pods.uses))
        self.workers = Workers()

    def start(self) -> None:
        self.workers.every(self.guards.monitor.period_s, self.sample_once, "usage-monitor",
                           "usage sample")

    def stop(self) -> None:
        self.workers.stop()
        self.actions.resume_all()  # a paused container is not left frozen

    def sample_once(self) -> None:
        """One round: a usage sample and its actions, then the GPU gauges."""
        self.monitor.sample_once()
        if self.guards.metrics is not None:
            self._gauges(self.guards.metrics)

    def _gauges(self, m: NodeMetrics) -> None:
        held: dict[str, list[PreparedDevice]] = defaultdict(list)
        for claim in self.claims():
            for d in claim.devices:
                held[d.uuid].append(d)
        isolated = self.actions.isolated()
        if self.telemetry is not None:
            self.telemetry.export(self.gpus(), self.readings())
        for gpu in self.gpus():
            m.set_gpu(gpu, held.get(gpu.uuid, []), gpu.uuid in isolated)
