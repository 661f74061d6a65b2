"""The node agent's composition: GPUs, logical pool, gRPC server, kubelet, inventory.

Threads: the GPU backend's health watcher (calls ``_on_gpus``), the supervisor
(re-registers with kubelet when ``kubelet.sock`` is re-created or our socket
disappears), the inventory heartbeat, and gRPC's workers.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import grpc

from gpupool.core.errors import GpupoolError
from gpupool.nodeagent.allocator import Allocator, AllocatorConfig
from gpupool.nodeagent.cluster import InventoryApi, PodApi
from gpupool.nodeagent.gpu import GpuBackend, GpuInfo
from gpupool.nodeagent.inventory import Inventory
from gpupool.nodeagent.logical import LogicalPool, Split
from gpupool.nodeagent.nodestate import holds_gpus
from gpupool.nodeagent.podresources import PodResourcesClient
from gpupool.nodeagent.pods import Pod
from gpupool.nodeagent.server import KUBELET_SOCKET, DevicePluginService, PluginSocket, register

log = logging.getLogger(__name__)
VANISHED = "vanished"


@dataclass(frozen=True, slots=True)
class AgentConfig:
    node: str
    kubelet_dir: Path = Path("/var/lib/kubelet")
    split: Split = field(default_factory=Split)
    memory_unit_mib: int = 256
    mps_pipe_dir: str = ""
    heartbeat_s: float = 30.0
    watch_s: float = 0.1

    @property
    def plugin_dir(self) -> Path:
        return self.kubelet_dir / "device-plugins"

    @property
    def pod_resources_socket(self) -> Path:
        return self.kubelet_dir / "pod-resources" / KUBELET_SOCKET


class NodeAgent:
    """Runs the device plugin for one node until ``stop``."""

    def __init__(self, config: AgentConfig, backend: GpuBackend, pods: PodApi,
                 inventory: InventoryApi | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)):
        self.config = config
        self.backend = backend
        self.pods = pods
        self.clock = clock
        self.inventory = Inventory(config.node, inventory) if inventory is not None else None
        self._known = {g.uuid: g for g in backend.discover()}
        self.pool = LogicalPool(list(self._known.values()), config.split)
        self.kubelet = PodResourcesClient(config.pod_resources_socket, "gpupool.io/gpu")
        alloc_config = AllocatorConfig(config.node, config.memory_unit_mib, config.mps_pipe_dir)
        self.allocator = Allocator(alloc_config, pods, self.kubelet, self.pool, self.known_gpus,
                                   clock)
        self._stop = threading.Event()
        self._changed = threading.Event()
        self.service = DevicePluginService(self.pool, self.allocator, self._stop)
        self.socket = PluginSocket(config.plugin_dir, self.service)
        self.registrations = 0
        self._threads: list[threading.Thread] = []

    def known_gpus(self) -> list[GpuInfo]:
        """Every GPU seen since start (vanished ones unhealthy), by index."""
        return sorted(self._known.values(), key=lambda g: g.index)

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> None:
        self._restore()
        self.config.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.backend.watch(self._on_gpus)
        self._spawn(self._supervise, "kubelet-watch")
        if self.inventory is not None:
            self._spawn(self._heartbeat, "inventory")

    def stop(self) -> None:
        self._stop.set()
        self._changed.set()
        self.backend.close()
        for t in self._threads:
            t.join(timeout=3)
        self.socket.stop()
        self.kubelet.close()

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _restore(self) -> None:
        """Re-apply the logical-device assignments recorded on the pods that hold GPUs."""
        try:
            pods = self.pods.node_pods(self.config.node)
        except GpupoolError as exc:
            log.warning("cannot read pods to restore logical devices: %s", exc)
            return
        owners = {lid: uuid for p in pods if holds_gpus(p) and not p.problem
                  for m in _served(p) for lid, uuid in m.items()}
        self.pool.restore(owners)

    # -- health ---------------------------------------------------------------------------
    def _on_gpus(self, present: Sequence[GpuInfo]) -> None:
        now = {g.uuid: g for g in present}
        for uuid, gpu in self._known.items():
            if uuid not in now:
                now[uuid] = replace(gpu, healthy=False, reason=VANISHED)
        self._known = now
        self.pool.update_gpus(list(present))
        self._changed.set()

    # -- kubelet ------------------------------------------------------------------------------
    def _supervise(self) -> None:
        kubelet_sock = self.config.plugin_dir / KUBELET_SOCKET
        registered_to = 0
        while not self._stop.is_set():
            ident = _identity(kubelet_sock)
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

    # -- inventory --------------------------------------------------------------------------------
    def _heartbeat(self) -> None:
        assert self.inventory is not None
        while not self._stop.is_set():
            self._changed.clear()
            self.inventory.sync(self.known_gpus(), self.clock())
            self._changed.wait(self.config.heartbeat_s)


def _served(pod: Pod) -> list[dict[str, str]]:
    try:
        return list(pod.served().values())
    except GpupoolError:
        return []


def _identity(path: Path) -> int:
    try:
        st = os.stat(path)
    except OSError:
        return 0
    return hash((st.st_ino, st.st_ctime_ns))
