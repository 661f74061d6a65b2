"""The node agent's composition: GPUs, logical pool, gRPC server, kubelet, inventory,
decision verification, isolation provider, usage monitor, metrics.

Threads: the GPU backend's health watcher (calls ``_on_gpus``), the supervisor
(re-registers with kubelet when ``kubelet.sock`` is re-created or our socket
disappears), the inventory heartbeat, the monitor (refuses unverifiable decisions on
the node, samples usage, acts on over-users, keeps the provider's settings current,
updates the metrics), the isolation provider's own (``mps``: daemon health), and
gRPC's workers.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc

from gpupool.core.allocation import Slice
from gpupool.core.errors import GpupoolError
from gpupool.core.mig import MigDevice
from gpupool.nodeagent import mig
from gpupool.nodeagent.actions import Actions, OveruseAction
from gpupool.nodeagent.allocator import Allocator, AllocatorConfig, Safety
from gpupool.nodeagent.burst import BurstTracker
from gpupool.nodeagent.burstreport import BurstWatch
from gpupool.nodeagent.cluster import EventApi, EvictionApi, InventoryApi, PodApi
from gpupool.nodeagent.exposure import Exposure
from gpupool.nodeagent.freezer import Freezer
from gpupool.nodeagent.gpu import GpuBackend, GpuInfo
from gpupool.nodeagent.inventory import Inventory
from gpupool.nodeagent.isolation.none import NoIsolation
from gpupool.nodeagent.isolation.provider import NODE_LABEL, IsolationProvider
from gpupool.nodeagent.logical import LogicalPool, Split
from gpupool.nodeagent.metrics import NodeMetrics
from gpupool.nodeagent.monitor import (
    Attribution,
    Held,
    MonitorConfig,
    UsageMonitor,
    held_slices,
)
from gpupool.nodeagent.nodestate import NO_GPU, served_devices
from gpupool.nodeagent.overuse import OveruseConfig, OveruseTracker
from gpupool.nodeagent.podresources import PodResourcesClient
from gpupool.nodeagent.pods import Pod
from gpupool.nodeagent.refusals import RefusalRecorder, audit
from gpupool.nodeagent.roster import GpuRoster
from gpupool.nodeagent.server import KUBELET_SOCKET, DevicePluginService, PluginSocket, register
from gpupool.nodeagent.slices import SliceAttribution
from gpupool.nodeagent.telemetry import TelemetryMetrics
from gpupool.nodeagent.verify import PATIENCE_S, DecisionGate, Verifier
from gpupool.nodeagent.workers import Workers

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AgentConfig:
    node: str
    kubelet_dir: Path = Path("/var/lib/kubelet")
    split: Split = field(default_factory=Split)
    memory_unit_mib: int = 256
    heartbeat_s: float = 30.0
    watch_s: float = 0.1
    decide_unscheduled: bool = False  # no extender: decide, and verify nothing
    monitor_s: float = 10.0
    proc_root: Path = Path("/proc")
    key_patience_s: float = PATIENCE_S  # an Allocate waits this long for unreadable keys
    mig_interval_s: float = mig.DEFAULT_INTERVAL_S  # at most one MIG repartition this often
    slice_namespace: str = ""  # remote slices' servers: their usage monitored ("": not)
    slice_client: tuple[tuple[str, str], ...] = ()  # remote-allowed pods served elsewhere

    @property
    def plugin_dir(self) -> Path:
        return self.kubelet_dir / "device-plugins"

    @property
    def pod_resources_socket(self) -> Path:
        return self.kubelet_dir / "pod-resources" / KUBELET_SOCKET


@dataclass
class Guards:
    """What keeps sharing safe on the node (the CLI builds it; tests choose parts)."""

    verifier: Verifier | None = None  # None: every decision counts (no verification)
    exposure: Exposure = field(default_factory=Exposure)
    provider: IsolationProvider = field(default_factory=NoIsolation)
    events: EventApi | None = None
    evictions: EvictionApi | None = None
    metrics: NodeMetrics | None = None
    overuse: OveruseConfig = field(default_factory=OveruseConfig)
    action: OveruseAction = OveruseAction.WARN
    freezer: Freezer | None = None  # ``pause``: the cgroup freezer (None: under proc_root)
    device_events: mig.DeviceEvents | None = None  # Events about GPUDevices (MIG changes)


class NodeAgent:
    """Runs the device plugin for one node until ``stop``."""

    def __init__(self, config: AgentConfig, backend: GpuBackend, pods: PodApi,
                 inventory: InventoryApi | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 guards: Guards | None = None, mig_driver: mig.MigDriver | None = None):
        self.config = config
        self.backend = backend
        self.pods = pods
        self.clock = clock
        g = self.guards = guards or Guards()
        self.provider = g.provider
        self.metrics = g.metrics
        self.telemetry = TelemetryMetrics(g.metrics.registry) if g.metrics is not None \
            else None
        self.gate = DecisionGate(config.node, None if config.decide_unscheduled else g.verifier,
                                 config.key_patience_s)
        self.recorder = RefusalRecorder(pods, g.events, g.metrics)
        self.actions = Actions(g.action, pods, g.events, g.evictions, g.metrics,
                               self._isolation_changed,
                               freezer=g.freezer or Freezer(config.proc_root))
        self.inventory = Inventory(config.node, inventory, {NODE_LABEL: str(g.provider.name)},
                                   self._device_status) if inventory is not None else None
        self.roster = GpuRoster(backend.discover())
        self.pool = LogicalPool(list(self.roster.known.values()), config.split)
        self.kubelet = PodResourcesClient(config.pod_resources_socket, "gpupool.io/gpu")
        safety = Safety(self.gate, g.exposure, g.provider, self.recorder, self.actions.isolated)
        self.allocator = Allocator(AllocatorConfig(config.node, config.memory_unit_mib,
                                                   config.decide_unscheduled,
                                                   config.slice_client),
                                   pods, self.kubelet, self.pool, self.known_gpus, clock, safety)
        self.monitor = UsageMonitor(MonitorConfig(config.node, config.proc_root,
                                                  config.monitor_s),
                                    backend.usage, self._cached_pods, self.gate,
                                    OveruseTracker(g.overuse), self.actions, g.metrics,
                                    attribution=self._slices(config),
                                    bursts=self._burst_watch())
        self.workers = Workers()
        self._stop = self.workers.stopping
        self._changed = threading.Event()
        self.service = DevicePluginService(self.pool, self.allocator, self._stop, g.metrics)
        self.socket = PluginSocket(config.plugin_dir, self.service)
        self.registrations = 0
        self.mig_driver = mig_driver  # None: MIG layouts asked on GPUDevices are not made
        self.repartitioner = None if mig_driver is None else mig.Repartitioner(
            config.node, mig_driver, self._mig_clients, g.device_events, clock, time.monotonic,
            config.mig_interval_s)

    def _slices(self, config: AgentConfig) -> Callable[[Sequence[Pod]], Attribution] | None:
        """The monitor's attribution with the remote slices this node serves (``slices``)."""
        if not config.slice_namespace:
            return None
        return lambda pods: SliceAttribution(config.proc_root, pods,
                                             held_slices(pods, self.gate),
                                             config.slice_namespace)

    def _burst_watch(self) -> BurstWatch:
        """Bursts judged against the memory of the GPUs present (``nodeagent.burst``)."""
        g = self.guards
        return BurstWatch(BurstTracker(g.overuse),
                          lambda: {u: gpu.memory_mib for u, gpu in self.roster.present.items()},
                          str(g.action), g.overuse.grace_s, g.events, g.metrics)

    def known_gpus(self) -> list[GpuInfo]:
        """Every GPU seen since start (vanished ones and those the isolation provider cannot
        serve unhealthy), by index."""
        return self.roster.served(self.provider.problems())

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> None:
        log.info("node %s: decisions %s; GPUs exposed by %s%s; isolation %s%s", self.config.node,
                 "verified" if self.gate.enabled else "NOT verified (--decide-unscheduled)",
                 self.guards.exposure.strategy,
                 "" if self.guards.exposure.safe else " (a pod's environment can widen them)",
                 self.provider.name, "" if self.provider.enforced else " (advisory)")
        if self.metrics is not None:
            self.metrics.provider.labels(str(self.provider.name),
                                         str(self.provider.enforced).lower()).set(1)
        self.provider.start(mig.shareable(self.roster.present.values()), self._provider_changed)
        self._restore()
        self.config.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.backend.watch(self._on_gpus)
        self.workers.spawn(self._supervise, "kubelet-watch")
        self.workers.every(self.config.monitor_s, self.check_once, "usage-monitor",
                           "usage sample")
        if self.inventory is not None:
            self.workers.spawn(self._heartbeat, "inventory")

    def stop(self) -> None:
        self.workers.signal(self._changed)
        self.backend.close()
        self.workers.join()
        # a paused container is not left frozen by a stopped agent: thawed once the monitor's
        # last round is over (thawed before it, a round under way could freeze it again)
        self.actions.resume_all()
        self.socket.stop()
        self.kubelet.close()
        self.provider.stop()

    def _restore(self) -> None:
        """Re-apply the logical-device assignments recorded on the pods that hold GPUs."""
        try:
            pods = self.pods.node_pods(self.config.node)
        except GpupoolError as exc:
            log.warning("cannot read pods to restore logical devices: %s", exc)
            return
        owners = {lid: uuid for p in pods if not p.problem
                  for m in served_devices(p, self.gate.trusted).values()
                  for lid, uuid in m.items() if uuid != NO_GPU}
        self.pool.restore(owners)

    def _cached_pods(self) -> list[Pod]:
        return self.pods.node_pods(self.config.node, fresh=False)

    # -- health ---------------------------------------------------------------------------
    def _on_gpus(self, present: Sequence[GpuInfo]) -> None:
        self.roster.update(present)
        self._refresh_pool()

    def _provider_changed(self) -> None:
        self._refresh_pool()

    def _refresh_pool(self) -> None:
        effective = {g.uuid: g for g in self.known_gpus()}
        self.pool.update_gpus([effective[u] for u in self.roster.present if u in effective])
        self._changed.set()

    def _isolation_changed(self) -> None:
        self._changed.set()

    def _device_status(self, uuid: str) -> dict[str, Any]:
        status = {"isolationProvider": str(self.provider.name),
                  "isolation": self.actions.isolation(uuid)}
        gpu = self.roster.known.get(uuid)
        layout = {} if gpu is None else mig.status(gpu, self.repartitioner)
        return {**status, "mig": layout} if layout else status

    # -- kubelet ------------------------------------------------------------------------------
    def _supervise(self) -> None:
        kubelet_sock = self.config.plugin_dir / KUBELET_SOCKET
        registered_to, waiting = 0, False
        while not self._stop.is_set():
            ident = _identity(kubelet_sock)
            if not ident and not waiting:
                log.info("waiting for kubelet: no registration socket at %s yet", kubelet_sock)
            waiting = not ident
            if ident and (ident != registered_to or not self.socket.healthy()):
                registered_to = ident if self._register(kubelet_sock) else 0
            self._stop.wait(self.config.watch_s)

    def _register(self, kubelet_sock: Path) -> bool:
        try:
            if not self.socket.healthy():
                self.socket.start()
            register(kubelet_sock)
        except (grpc.RpcError, OSError, RuntimeError) as exc:
            log.warning("registration with kubelet failed (will retry): %s", exc)
            return False
        self.registrations += 1
        log.info("registered gpupool.io/gpu with kubelet (%d)", self.registrations)
        return True

    # -- monitor ---------------------------------------------------------------------------------
    def check_once(self) -> None:
        """One round of the monitor thread: audit, usage sample, provider sync, gauges."""
        pods = self._cached_pods()
        audit(pods, self.gate, self.recorder)
        self.monitor.sample_once()
        held = held_slices(self._cached_pods(), self.gate)
        shared: dict[str, list[Slice]] = defaultdict(list)
        for h in held.values():
            if not h.exclusive:
                shared[h.slice.gpu_uuid].append(h.slice)
        self.provider.sync(shared, {p.uid for p in pods})
        if self.metrics is not None:
            self._gauges(held)

    def _gauges(self, held: dict[tuple[str, str, str], Held]) -> None:
        m = self.metrics
        assert m is not None
        isolated = self.actions.isolated()
        on_gpu: dict[str, list[Slice]] = defaultdict(list)
        for h in held.values():
            on_gpu[h.slice.gpu_uuid].append(h.slice)
        if self.telemetry is not None:
            self.telemetry.export(self.known_gpus(), self.backend.readings())
        for gpu in self.known_gpus():
            m.set_gpu(gpu, on_gpu.get(gpu.uuid, []), gpu.uuid in isolated)
            up: Any = getattr(self.provider, "daemon_up", None)
            if up is not None:
                m.mps_up.labels(gpu.uuid).set(1 if up(gpu.uuid) else 0)
                restarts = getattr(self.provider, "restarts", {})
                m.mps_restarts.labels(gpu.uuid).set(restarts.get(gpu.uuid, 0))

    # -- inventory --------------------------------------------------------------------------------
    def _heartbeat(self) -> None:
        assert self.inventory is not None
        while not self._stop.is_set():
            self._changed.clear()
            objects = self.inventory.sync(self.known_gpus(), self.clock())
            if self._repartition(objects):
                continue  # publish the new MIG devices now
            self._changed.wait(self.config.heartbeat_s)

    # -- MIG on demand ------------------------------------------------------------------------
    def _repartition(self, objects: list[dict[str, Any]]) -> bool:
        """Make the MIG layouts asked on this node's GPUDevices (``nodeagent.mig``)."""
        if self.repartitioner is None or self.mig_driver is None:
            return False
        physical = [g for g in self.known_gpus() if not isinstance(g.mig, MigDevice)]
        if not self.repartitioner.step(physical, objects):
            return False
        self._on_gpus(self.mig_driver.rescan())
        return True

    def _mig_clients(self, uuid: str) -> list[str]:
        """Who uses a MIG device: pods whose trusted decisions hold it, processes on it."""
        assert self.mig_driver is not None
        pods = {p.uid: p for p in self._cached_pods()}
        held = held_slices(pods.values(), self.gate)
        named = sorted({f"pod {pods[uid].ref}" for uid, _, gpu in held if gpu == uuid})
        return named + self.mig_driver.processes(uuid)


def _identity(path: Path) -> int:
    try:
        st = os.stat(path)
    except OSError:
        return 0
    return hash((st.st_ino, st.st_ctime_ns))
