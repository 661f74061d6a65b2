"""The node agent in DRA mode: the kubelet DRA plugin of driver ``gpu.gpupool.io``.

Threads: the GPU backend's health watcher (calls ``_on_gpus``), the slice publisher
(writes the ResourceSlice on every change and every ``resync_s``), the inventory
heartbeat (GPUDevice objects, as on the device-plugin path, labelled
``gpupool.io/node-mode: dra``), the supervisor (serves the two sockets again when
kubelet removed them), the isolation provider's own, and gRPC's workers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc

from gpupool.contract import dra
from gpupool.contract.devices import read_device
from gpupool.core.errors import GpupoolError
from gpupool.nodeagent.cluster import InventoryApi
from gpupool.nodeagent.dra.cdi import DEFAULT_CDI_DIR, CdiSpecs
from gpupool.nodeagent.dra.checkpoint import Checkpoint
from gpupool.nodeagent.dra.claimsource import DraCluster
from gpupool.nodeagent.dra.preparer import PrepareConfig, Preparer
from gpupool.nodeagent.dra.service import (
    DRA_SOCKET,
    REGISTRATION_SOCKET,
    RegistrationService,
    add_dra_services,
    reg_grpc,
)
from gpupool.nodeagent.dra.slices import SlicePublisher
from gpupool.nodeagent.dra.watch import ClaimWatch, DraGuards
from gpupool.nodeagent.exposure import Exposure
from gpupool.nodeagent.gpu import GpuBackend, GpuInfo
from gpupool.nodeagent.inventory import Inventory, device_object
from gpupool.nodeagent.isolation.none import NoIsolation
from gpupool.nodeagent.isolation.provider import NODE_LABEL, IsolationProvider
from gpupool.nodeagent.roster import GpuRoster
from gpupool.nodeagent.unixserver import UnixServer
from gpupool.nodeagent.workers import Workers

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DraConfig:
    node: str
    kubelet_dir: Path = Path("/var/lib/kubelet")
    cdi_dir: Path = DEFAULT_CDI_DIR
    state_dir: Path = Path("/var/lib/gpupool")
    memory_unit_mib: int = 256
    heartbeat_s: float = 30.0
    resync_s: float = 60.0  # the slice is compared with the server's at least this often
    watch_s: float = 0.5  # how often the sockets are checked
    versions: Mapping[str, str] = field(default_factory=dict)  # driver / CUDA versions

    @property
    def registration_socket(self) -> Path:
        return self.kubelet_dir / "plugins_registry" / REGISTRATION_SOCKET

    @property
    def dra_socket(self) -> Path:
        return self.kubelet_dir / "plugins" / dra.DRIVER / DRA_SOCKET

    @property
    def checkpoint(self) -> Path:
        """The directory of the claim files (``dra.checkpoint``)."""
        return self.state_dir / "dra" / "claims"

    @property
    def legacy_checkpoint(self) -> Path:
        return self.state_dir / "dra" / "checkpoint.json"


class DraAgent:
    """Runs the DRA plugin for one node until ``stop``."""

    def __init__(self, config: DraConfig, backend: GpuBackend, cluster: DraCluster,
                 inventory: InventoryApi | None = None, *,
                 exposure: Exposure | None = None, provider: IsolationProvider | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 guards: DraGuards | None = None):
        self.config = config
        self.backend = backend
        self.clock = clock
        self.provider = provider or NoIsolation()
        self.exposure = exposure or Exposure()
        self.roster = GpuRoster(backend.discover())
        self.labels = {NODE_LABEL: str(self.provider.name), dra.NODE_MODE_LABEL: dra.MODE_DRA}
        self.watch = ClaimWatch(guards, backend.usage, lambda: self.preparer.prepared(),
                                self._isolation_changed, self.known_gpus,
                                backend.readings) \
            if guards is not None else None
        self.preparer = Preparer(PrepareConfig(config.node, config.memory_unit_mib), cluster,
                                 self.known_gpus,
                                 Checkpoint(config.checkpoint, config.legacy_checkpoint),
                                 CdiSpecs(config.cdi_dir), self.exposure, self.provider,
                                 self.watch.actions.isolated if self.watch else set)
        self.publisher = SlicePublisher(config.node, cluster, config.memory_unit_mib, clock)
        if self.watch is not None:
            self.publisher.isolated = self.watch.actions.isolated
        self.inventory = Inventory(config.node, inventory, self.labels, self._device_status) \
            if inventory is not None else None
        self.registration = RegistrationService(config.dra_socket)
        self.dra_server = UnixServer(config.dra_socket,
                                     lambda s: add_dra_services(s, self.preparer), name="dra")
        self.reg_server = UnixServer(
            config.registration_socket,
            lambda s: reg_grpc.add_RegistrationServicer_to_server(self.registration, s),
            workers=2, name="dra-registration")
        self.published = threading.Event()  # set after each successful publication round
        self.workers = Workers()
        self._stop = self.workers.stopping
        self._changed = threading.Event()
        self._isolation = threading.Event()  # the GPUDevice objects are written again

    def known_gpus(self) -> list[GpuInfo]:
        """Every GPU seen since start (vanished ones, and those the isolation provider cannot
        serve, unhealthy), by index."""
        return self.roster.served(self.provider.problems())

    def selector_labels(self, gpu: GpuInfo) -> Mapping[str, str]:
        """The labels a resource class selects this GPU by — read back from the GPUDevice
        this agent publishes, exactly as the extender and the controller read them."""
        obj = device_object(self.config.node, gpu, self.clock(), self.labels)
        return read_device(obj).gpu.label_map()

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        log.info("node %s: DRA driver %s; GPUs exposed by %s; isolation %s%s",
                 self.config.node, dra.DRIVER, self.exposure.strategy, self.provider.name,
                 "" if self.provider.enforced else " (advisory)")
        self.provider.start(list(self.roster.present.values()), self._refresh)
        restored = self.preparer.restore()
        if restored:
            log.info("%d prepared claims taken back from %s", restored, self.config.checkpoint)
        self.dra_server.start()
        self.reg_server.start()
        self.backend.watch(self._on_gpus)
        self.workers.spawn(self._publish_loop, "resource-slice")
        self.workers.spawn(self._supervise, "dra-sockets")
        if self.inventory is not None:
            self.workers.spawn(self._heartbeat, "inventory")
        if self.watch is not None:
            self.watch.start()

    def stop(self) -> None:
        self.workers.signal(self._changed, self._isolation)
        self.backend.close()
        if self.watch is not None:
            self.watch.stop()
        self.workers.join()
        self.reg_server.stop()
        self.dra_server.stop()
        self.provider.stop()

    # -- health ----------------------------------------------------------------------------
    def _on_gpus(self, present: Sequence[GpuInfo]) -> None:
        self.roster.update(present)
        self._refresh()

    def _refresh(self) -> None:
        self._changed.set()

    def _isolation_changed(self) -> None:
        self._isolation.set()
        self._changed.set()

    def _device_status(self, uuid: str) -> dict[str, Any]:
        status: dict[str, Any] = {"isolationProvider": str(self.provider.name)}
        if self.watch is not None:
            status["isolation"] = self.watch.actions.isolation(uuid)
        return status

    # -- threads ----------------------------------------------------------------------------
    def _publish_loop(self) -> None:
        while not self._stop.is_set():
            self._changed.clear()
            try:
                self.publisher.publish(self.known_gpus(), self.selector_labels,
                                       self.config.versions, self.clock())
                self.published.set()
                wait = self.config.resync_s
            except GpupoolError as exc:
                log.warning("ResourceSlice of %s not written (retrying in 1 s): %s",
                            self.config.node, exc)
                wait = 1.0
            self._changed.wait(wait)

    def _supervise(self) -> None:
        while not self._stop.wait(self.config.watch_s):
            for server in (self.dra_server, self.reg_server):
                if not server.healthy():
                    log.warning("socket %s was removed; serving it again", server.path)
                    try:
                        server.start()
                    except (OSError, RuntimeError, grpc.RpcError) as exc:
                        log.error("cannot serve %s (retrying): %s", server.path, exc)

    def _heartbeat(self) -> None:
        assert self.inventory is not None
        while not self._stop.is_set():
            self._isolation.clear()
            self.inventory.sync(self.known_gpus(), self.clock())
            self._isolation.wait(self.config.heartbeat_s)
