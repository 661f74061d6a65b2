"""GPU discovery, topology, telemetry and health through NVML (nvidia-ml-py's ``pynvml``).

Discovery reads each GPU's identity, memory, NUMA node, architecture, make
(``nvmlhealth.facts``), its links to the other GPUs (``nvmltopology``) and its MIG
mode and devices (``nvmlmig``; ``rescan_mig`` reads them again). Health
comes from NVML XID critical-error events (``nvmlEventTypeXidCriticalError``; XIDs
caused by applications are ignored) and from a reading of every GPU every ``poll_s``
(``nvmlhealth.read``), judged by ``health.HealthJudge`` (docs/node-agent.md,
"Health"): healthy, degraded (served, reported) or unhealthy (no new placements; its
pods are healed elsewhere by the controller), back to a better level once the cause
has been quiet for ``recover_after_s``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pynvml

from gpupool.core.errors import GpupoolError
from gpupool.nodeagent import nvmlhealth, nvmlmig, nvmltopology, nvmlusage
from gpupool.nodeagent.dra.versions import nvml_versions
from gpupool.nodeagent.gpu import GpuInfo, GpuUsage, HealthListener
from gpupool.nodeagent.health import Finding, GpuReading, HealthConfig, HealthJudge, Level

log = logging.getLogger(__name__)

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
"""XIDs raised by a misbehaving application, not by a failing GPU."""

_ARCHITECTURES = {
    getattr(pynvml, f"NVML_DEVICE_ARCH_{name.upper()}"): name
    for name in ("kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper",
                 "blackwell")
    if hasattr(pynvml, f"NVML_DEVICE_ARCH_{name.upper()}")
}


class NvmlUnavailable(GpupoolError):
    """NVML cannot be loaded or initialised on this machine."""


class NvmlGpuBackend:
    """The node's real GPUs through NVML."""

    def __init__(self, poll_s: float = 1.0, recover_after_s: float = 60.0,
                 sysfs: Path = Path("/sys/bus/pci/devices"),
                 health: HealthConfig | None = None,
                 clock: Callable[[], float] = time.monotonic):
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(
                f"NVML is not available ({exc}); run on a node with the NVIDIA driver, "
                "or use --fake-gpus FILE") from None
        self.poll_s = poll_s
        self.sysfs = sysfs
        self.clock = clock
        self.judge = HealthJudge(health or HealthConfig(recover_after_s=recover_after_s))
        try:
            self._gpus = {g.uuid: g for g in self._query()}
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML could not list the GPUs: {exc}") from None
        self._readings: dict[str, GpuReading] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._since_us: dict[str, int] = {}

    def discover(self) -> tuple[GpuInfo, ...]:
        with self._lock:
            return tuple(sorted(self._gpus.values(), key=lambda g: g.index))

    def watch(self, listener: HealthListener) -> None:
        self._thread = threading.Thread(target=self._run, args=(listener,), name="nvml-health",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as exc:
            log.warning("nvmlShutdown failed: %s", exc)

    # -- usage and compute mode (the usage monitor, the mps provider) ----------------
    def usage(self) -> tuple[GpuUsage, ...]:
        out = []
        for gpu in self.discover():
            sample, self._since_us[gpu.uuid] = nvmlusage.sample(
                gpu.uuid, self._since_us.get(gpu.uuid, 0))
            out.append(sample)
        return tuple(out)

    def set_compute_mode(self, uuid: str, exclusive_process: bool) -> None:
        nvmlusage.set_compute_mode(uuid, exclusive_process)

    def readings(self) -> tuple[GpuReading, ...]:
        """The latest health and telemetry reading of every GPU (the metrics read them)."""
        with self._lock:
            return tuple(self._readings[u] for u in sorted(self._readings))

    # -- discovery ----------------------------------------------------------------
    def _query(self) -> list[GpuInfo]:
        versions = nvml_versions()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        gpus = [self._describe(i, h, versions) for i, h in enumerate(handles)]
        buses = {g.uuid: nvmltopology.bus_id(pynvml.nvmlDeviceGetPciInfo(h).busId)
                 for g, h in zip(gpus, handles, strict=True)}
        links = nvmltopology.links({g.uuid: h for g, h in zip(gpus, handles, strict=True)},
                                   buses)
        return [replace(g, links=links.get(g.uuid, ())) for g in gpus]

    def _describe(self, index: int, handle: Any, versions: dict[str, str]) -> GpuInfo:
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
        return GpuInfo(
            uuid=uuid, index=index,
            model=_text(pynvml.nvmlDeviceGetName(handle)).replace("NVIDIA ", "").replace(" ", "-"),
            memory_mib=int(memory.total) // (1024 * 1024),
            numa_node=self._numa_node(handle), architecture=_architecture(handle),
            facts=nvmlhealth.facts(handle, versions), mig=nvmlmig.read(handle, uuid))

    def rescan_mig(self) -> tuple[GpuInfo, ...]:
        """Read every GPU's MIG mode and devices again (after a repartition); the GPUs."""
        with self._lock:
            uuids = list(self._gpus)
        for uuid in uuids:
            try:
                mode = nvmlmig.read(pynvml.nvmlDeviceGetHandleByUUID(uuid), uuid)
            except pynvml.NVMLError as exc:
                log.warning("GPU %s: cannot read its MIG devices again: %s", uuid, exc)
                continue
            with self._lock:
                self._gpus[uuid] = replace(self._gpus[uuid], mig=mode)
        return self.discover()

    def _numa_node(self, handle: Any) -> int:
        try:
            node = int(pynvml.nvmlDeviceGetNumaNodeId(handle))
            return max(node, 0)
        except pynvml.NVMLError:
            pass
        bus_id = nvmltopology.bus_id(pynvml.nvmlDeviceGetPciInfo(handle).busId)
        path = self.sysfs / bus_id / "numa_node"
        try:
            return max(int(path.read_text().strip()), 0)
        except (OSError, ValueError):
            return 0

    # -- health -------------------------------------------------------------------
    def _run(self, listener: HealthListener) -> None:
        events = self._register_events()
        next_poll = time.monotonic()
        while not self._stop.is_set():
            if events is not None:
                self._wait_event(events, listener)
            else:
                self._stop.wait(self.poll_s)
            if time.monotonic() >= next_poll:
                self._poll(listener)
                next_poll = time.monotonic() + self.poll_s

    def _register_events(self) -> Any:
        try:
            events = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            log.warning("NVML events unavailable (%s); health by polling only", exc)
            return None
        for uuid in list(self._gpus):
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
                pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError,
                                                events)
            except pynvml.NVMLError as exc:
                log.warning("GPU %s: no XID events (%s); polled only", uuid, exc)
        return events

    def _wait_event(self, events: Any, listener: HealthListener) -> None:
        try:
            data = pynvml.nvmlEventSetWait_v2(events, int(self.poll_s * 1000))
        except pynvml.NVMLError as exc:
            if exc.value != pynvml.NVML_ERROR_TIMEOUT:
                log.warning("waiting for NVML events failed: %s", exc)
                self._stop.wait(self.poll_s)
            return
        xid = int(data.eventData)
        if data.eventType != pynvml.nvmlEventTypeXidCriticalError or xid in APPLICATION_XIDS:
            return
        try:
            uuid = _text(pynvml.nvmlDeviceGetUUID(data.device))
        except pynvml.NVMLError:
            return
        verdict = self.judge.note(uuid, Finding(Level.UNHEALTHY, f"critical XID {xid}"),
                                  self.clock())
        self._set(uuid, verdict.level, verdict.reason, listener)

    def _poll(self, listener: HealthListener) -> None:
        now = self.clock()
        for uuid in list(self._gpus):
            try:
                reading = nvmlhealth.read(pynvml.nvmlDeviceGetHandleByUUID(uuid), uuid)
            except pynvml.NVMLError as exc:
                lost = exc.value == pynvml.NVML_ERROR_GPU_IS_LOST
                reading = GpuReading(uuid, lost=lost, error="" if lost else str(exc))
            with self._lock:
                self._readings[uuid] = reading
            verdict = self.judge.judge(reading, now)
            self._set(uuid, verdict.level, verdict.reason, listener)

    def _set(self, uuid: str, level: Level, reason: str, listener: HealthListener) -> None:
        healthy = level is not Level.UNHEALTHY
        why, degraded = ("", reason if level is Level.DEGRADED else "") if healthy \
            else (reason, "")
        with self._lock:
            gpu = self._gpus.get(uuid)
            if gpu is None or (gpu.healthy, gpu.reason, gpu.degraded) == (healthy, why,
                                                                          degraded):
                return
            self._gpus[uuid] = replace(gpu, healthy=healthy, reason=why, degraded=degraded)
            current = tuple(sorted(self._gpus.values(), key=lambda g: g.index))
        log.info("GPU %s is now %s %s", uuid, level.spelling.lower(), reason)
        listener(current)


def _architecture(handle: Any) -> str:
    try:
        return _ARCHITECTURES.get(int(pynvml.nvmlDeviceGetArchitecture(handle)), "unknown")
    except pynvml.NVMLError:
        return "unknown"


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
