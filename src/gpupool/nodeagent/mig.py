"""MIG on the node: the MIG devices the agent serves, and the repartitions it makes.

**Serving.** A GPU backend (``nvmlmig`` on a node, ``fakemig`` in a fake GPU file) reports
a GPU in MIG mode with its MIG devices (``GpuInfo.mig``: a ``MigMode`` whose
``instances`` NVML listed). ``units`` turns each into what the agent serves: the GPU
itself (kept, never handed out: the core counts it absent, the logical pool gives it no
device, its GPUDevice says ``spec.mig.mode: Enabled``) and one unit per MIG device — a
``GpuInfo`` of its own with the MIG uuid, the device's memory, its GPU's index, model,
NUMA node, labels and health, and ``mig`` the ``MigDevice``. Everything downstream (the
roster, logical devices, GPUDevices, the ResourceSlice, Allocate's checks, exposure by
uuid) serves a unit like a GPU; a MIG device is handed out whole (the core's rule).

**Repartitions** (MIG on demand, off unless ``--mig-on-demand``): the controller asks for
a GPU's layout with the annotation ``gpupool.io/mig-layout`` on its GPUDevice
(``contract.mig``). ``Repartitioner.step`` compares it with what NVML lists and, when
they differ:

* refuses (``Refused``) a layout NVIDIA's rules forbid, a GPU that is unhealthy or not in
  MIG mode, and any change that destroys a MIG device with a client — a pod the node's
  trusted decisions place on it, or a process NVML sees on it;
* waits while the node changed a layout less than ``interval_s`` ago (the rate limit);
* else destroys the devices the layout drops and creates those it adds, through the
  ``MigDriver`` (NVML's create and destroy of GPU and compute instances, as NVIDIA's
  mig-parted makes them; ``Failed`` with NVML's reason when the driver refuses).

A refused layout is looked at again at every step (the client may have gone); a made or
failed one is not, until another layout is asked. Every outcome is recorded once: the
GPU's ``status.mig`` (``layout``,
``requested``, ``state``, ``message``, ``changedTime``) and an Event about its GPUDevice
(``GpupoolMigRepartitioned``, ``GpupoolMigRepartitionRefused``,
``GpupoolMigRepartitionFailed``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol

from gpupool.contract import mig as contract
from gpupool.core import mig
from gpupool.core.errors import GpupoolError, InvalidInput
from gpupool.core.mig import MigDevice, MigMode
from gpupool.nodeagent.gpu import GpuInfo

log = logging.getLogger(__name__)

EVENT_DONE = "GpupoolMigRepartitioned"
EVENT_REFUSED = "GpupoolMigRepartitionRefused"
EVENT_FAILED = "GpupoolMigRepartitionFailed"
DEFAULT_INTERVAL_S = 300.0


class MigError(GpupoolError):
    """The driver could not create or destroy a MIG device (the message says why)."""


# -- serving -----------------------------------------------------------------------------------
def units(gpus: Iterable[GpuInfo]) -> list[GpuInfo]:
    """The GPUs, each followed by its MIG devices as units of their own."""
    out: list[GpuInfo] = []
    for gpu in gpus:
        out.append(gpu)
        if isinstance(gpu.mig, MigMode):
            out += [unit(gpu, i) for i in gpu.mig.instances]
    return out


def unit(parent: GpuInfo, instance: mig.MigInstance) -> GpuInfo:
    """One MIG device as the agent serves it."""
    return replace(parent, uuid=instance.uuid, memory_mib=instance.memory_mib, links=(),
                   mig=instance.device)


def gone(gpu: GpuInfo, present: Mapping[str, GpuInfo]) -> bool:
    """A MIG device no longer listed while its GPU still is: destroyed (by a repartition or
    an administrator), not vanished — the roster drops it."""
    return isinstance(gpu.mig, MigDevice) and gpu.mig.parent in present


def shareable(gpus: Iterable[GpuInfo]) -> list[GpuInfo]:
    """The GPUs an isolation provider shares: neither GPUs in MIG mode nor MIG devices."""
    return [g for g in gpus if g.mig is None]


def layout_of(gpu: GpuInfo) -> tuple[MigDevice, ...]:
    """The MIG devices NVML lists on a GPU in MIG mode (by placement)."""
    if not isinstance(gpu.mig, MigMode):
        return ()
    return tuple(sorted((i.device for i in gpu.mig.instances), key=lambda d: d.start))


# -- repartitions -------------------------------------------------------------------------------
class MigDriver(Protocol):
    """Creates and destroys MIG devices (``nvmlmig.NvmlMigDriver``; ``fakemig`` in tests)."""

    def create(self, gpu: str, profile: str, start: int) -> None:
        """A GPU instance of ``profile`` at memory slice ``start`` with one compute instance
        spanning it; ``MigError`` says why not."""
        ...

    def destroy(self, gpu: str, device: MigDevice) -> None:
        """The device's compute instance, then its GPU instance; ``MigError`` says why not."""
        ...

    def rescan(self) -> tuple[GpuInfo, ...]:
        """The GPUs as the backend lists them now (their MIG devices read again)."""
        ...

    def processes(self, uuid: str) -> list[str]:
        """The processes on a MIG device ("process 4242"); one entry saying so when they
        cannot be read (then the device counts as in use)."""
        ...


class DeviceEvents(Protocol):
    """Events about a GPUDevice (``kubectl describe gpudevice`` lists them)."""

    def device_event(self, name: str, reason: str, message: str, warning: bool) -> None: ...


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one asked layout (``status.mig``)."""

    requested: str
    state: str
    message: str
    changed: str  # RFC 3339

    def status(self, layout: str) -> dict[str, Any]:
        return {"layout": layout, "requested": self.requested, "state": self.state,
                "message": self.message, "changedTime": self.changed}


Clients = Callable[[str], list[str]]
"""A MIG device's uuid -> who uses it ("pod ns/name", "process 4242"); [] when idle."""


class Repartitioner:
    """Makes the MIG layouts asked on this node's GPUDevices, one node-wide change at a
    time and at most one every ``interval_s``."""

    def __init__(self, node: str, driver: MigDriver, clients: Clients,
                 events: DeviceEvents | None, clock: Callable[[], datetime],
                 monotonic: Callable[[], float], interval_s: float = DEFAULT_INTERVAL_S):
        self.node = node
        self.driver = driver
        self.clients = clients
        self.events = events
        self.clock = clock
        self.monotonic = monotonic
        self.interval_s = interval_s
        self._last_change: float | None = None
        self._outcomes: dict[str, Outcome] = {}  # GPU uuid -> the last asked layout's
        self._lock = threading.Lock()

    def outcome(self, uuid: str) -> Outcome | None:
        with self._lock:
            return self._outcomes.get(uuid)

    def step(self, gpus: Sequence[GpuInfo], objects: Sequence[Mapping[str, Any]]) -> bool:
        """Act on the layouts asked by ``objects`` (this node's GPUDevices) for ``gpus``
        (the physical GPUs); True when a layout was changed (the caller lists the GPUs
        again)."""
        asked = _asked(objects)
        changed = False
        for gpu in gpus:
            want = asked.get(gpu.uuid)
            if want is None:
                continue
            changed |= self._one(gpu, want[0], want[1], want[2])
        return changed

    def _one(self, gpu: GpuInfo, requested: str, why: str, name: str) -> bool:
        with self._lock:
            done = self._outcomes.get(gpu.uuid)
        if done is not None and done.requested == requested and \
                done.state != contract.STATE_REFUSED:
            return False  # made (or failed) once: a new layout must be asked
        current = layout_of(gpu)
        try:
            target = self._target(gpu, requested)
        except InvalidInput as exc:
            self._record(gpu, name, requested, contract.STATE_REFUSED, str(exc))
            return False
        if target == current:
            return False
        drop = [d for d in current if d not in target]
        add = [d for d in target if d not in current]
        busy = [f"{d.describe()} ({', '.join(who)})" for d in drop
                for who in [self._clients_of(gpu, d)] if who]
        if busy:
            self._record(gpu, name, requested, contract.STATE_REFUSED,
                         f"MIG devices in use would be destroyed: {'; '.join(busy)}")
            return False
        if not self._due():
            return False
        return self._apply(gpu, name, requested, why, drop, add)

    def _target(self, gpu: GpuInfo, requested: str) -> tuple[MigDevice, ...]:
        if not isinstance(gpu.mig, MigMode):
            raise InvalidInput(f"GPU {gpu.uuid} is not in MIG mode (gpupool does not switch "
                               "MIG mode: it needs a GPU reset)")
        if not gpu.healthy:
            raise InvalidInput(f"GPU {gpu.uuid} is unhealthy ({gpu.reason})")
        geometry = mig.geometry_of(gpu.model, gpu.memory_mib)
        if geometry is None:
            raise InvalidInput(f"GPU {gpu.uuid} ({gpu.model}) has no MIG profiles gpupool knows")
        asked = mig.read_layout(geometry, gpu.uuid, requested,
                                f"annotation {contract.ANNOTATION_LAYOUT}")
        now = {(d.profile, d.start): d for d in layout_of(gpu)}
        return tuple(now.get((d.profile, d.start), d) for d in asked)

    def _clients_of(self, gpu: GpuInfo, device: MigDevice) -> list[str]:
        assert isinstance(gpu.mig, MigMode)
        for i in gpu.mig.instances:
            if i.device == device:
                return self.clients(i.uuid)
        return []

    def _due(self) -> bool:
        now = self.monotonic()
        if self._last_change is not None and now - self._last_change < self.interval_s:
            return False
        self._last_change = now
        return True

    def _apply(self, gpu: GpuInfo, name: str, requested: str, why: str,
               drop: Sequence[MigDevice], add: Sequence[MigDevice]) -> bool:
        before = mig.describe_layout(layout_of(gpu))
        try:
            for d in drop:
                self.driver.destroy(gpu.uuid, d)
            for d in add:
                self.driver.create(gpu.uuid, d.profile, d.start)
        except MigError as exc:
            self._record(gpu, name, requested, contract.STATE_FAILED,
                         f"{before} -> {requested}: {exc}")
            return True  # something may have changed before the failure
        self._record(gpu, name, requested, contract.STATE_APPLIED,
                     f"{before} -> {requested}" + (f": {why}" if why else ""))
        return True

    def _record(self, gpu: GpuInfo, name: str, requested: str, state: str, message: str
                ) -> None:
        with self._lock:
            last = self._outcomes.get(gpu.uuid)
            if last is not None and (last.requested, last.state, last.message) == \
                    (requested, state, message):
                return  # said already (a refusal is looked at again every step)
            self._outcomes[gpu.uuid] = Outcome(requested, state, message,
                                               self.clock().strftime("%Y-%m-%dT%H:%M:%SZ"))
        reason = {contract.STATE_APPLIED: EVENT_DONE, contract.STATE_REFUSED: EVENT_REFUSED
                  }.get(state, EVENT_FAILED)
        text = f"GPU {gpu.index} ({gpu.uuid}): {message}"
        (log.info if state == contract.STATE_APPLIED else log.warning)("MIG: %s", text)
        if self.events is not None:
            self.events.device_event(name, reason, text, state != contract.STATE_APPLIED)


def status(gpu: GpuInfo, repartitioner: Repartitioner | None) -> dict[str, Any]:
    """``status.mig`` of a GPU in MIG mode: its layout, and the outcome of the last layout
    asked ({} for any other GPU)."""
    if not isinstance(gpu.mig, MigMode):
        return {}
    layout = mig.describe_layout(layout_of(gpu))
    outcome = None if repartitioner is None else repartitioner.outcome(gpu.uuid)
    return {"layout": layout} if outcome is None else outcome.status(layout)


def _asked(objects: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str, str, str]]:
    """GPU uuid -> (asked layout, why, GPUDevice name) of the objects that ask one."""
    out = {}
    for obj in objects:
        meta = obj.get("metadata") or {}
        notes = meta.get("annotations") or {}
        layout = notes.get(contract.ANNOTATION_LAYOUT)
        uuid = (obj.get("spec") or {}).get("uuid")
        if isinstance(layout, str) and isinstance(uuid, str):
            out[uuid] = (layout.strip(), str(notes.get(contract.ANNOTATION_REASON) or ""),
                         str(meta.get("name") or ""))
    return out


def pod_clients(held: Mapping[str, Collection[str]]) -> Clients:
    """``Clients`` from who holds each GPU uuid (pods by the node's trusted decisions)."""
    return lambda uuid: sorted(held.get(uuid, ()))
