"""GPU discovery and health through NVML (nvidia-ml-py's ``pynvml``).

Health comes from two sources: NVML XID critical-error events
(``nvmlEventTypeXidCriticalError``) and polling every ``poll_s``. A GPU turns
unhealthy on a critical XID (XIDs caused by applications are ignored) or when
NVML can no longer query it; it is advertised healthy again once NVML answers
for it and no critical XID was seen for ``recover_after_s`` seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pynvml

from gpupool.core.errors import GpupoolError
from gpupool.nodeagent import nvmlusage
from gpupool.nodeagent.gpu import GpuInfo, GpuUsage, HealthListener

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
                 sysfs: Path = Path("/sys/bus/pci/devices")):
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(
                f"NVML is not available ({exc}); run on a node with the NVIDIA driver, "
                "or use --fake-gpus FILE") from None
        self.poll_s = poll_s
        self.recover_after_s = recover_after_s
        self.sysfs = sysfs
        try:
            self._gpus = {g.uuid: g for g in self._query()}
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML could not list the GPUs: {exc}") from None
        self._last_xid: dict[str, float] = {}
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

    # -- discovery ----------------------------------------------------------------
    def _query(self) -> list[GpuInfo]:
        return [self._describe(i, pynvml.nvmlDeviceGetHandleByIndex(i))
                for i in range(pynvml.nvmlDeviceGetCount())]

    def _describe(self, index: int, handle: Any) -> GpuInfo:
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return GpuInfo(
            uuid=_text(pynvml.nvmlDeviceGetUUID(handle)), index=index,
            model=_text(pynvml.nvmlDeviceGetName(handle)).replace("NVIDIA ", "").replace(" ", "-"),
            memory_mib=int(memory.total) // (1024 * 1024),
            numa_node=self._numa_node(handle), architecture=_architecture(handle))

    def _numa_node(self, handle: Any) -> int:
        try:
            node = int(pynvml.nvmlDeviceGetNumaNodeId(handle))
            return max(node, 0)
        except pynvml.NVMLError:
            pass
        bus_id = _text(pynvml.nvmlDeviceGetPciInfo(handle).busId).lower()
        domain, _, rest = bus_id.partition(":")
        path = self.sysfs / f"{domain[-4:]}:{rest}" / "numa_node"
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
        self._last_xid[uuid] = time.monotonic()
        self._set(uuid, False, f"critical XID {xid}", listener)

    def _poll(self, listener: HealthListener) -> None:
        for uuid in list(self._gpus):
            try:
                pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByUUID(uuid))
            except pynvml.NVMLError as exc:
                self._set(uuid, False, f"NVML cannot query the GPU: {exc}", listener)
                continue
            quiet = time.monotonic() - self._last_xid.get(uuid, float("-inf"))
            if quiet >= self.recover_after_s:
                self._set(uuid, True, "", listener)

    def _set(self, uuid: str, healthy: bool, reason: str, listener: HealthListener) -> None:
        with self._lock:
            gpu = self._gpus.get(uuid)
            if gpu is None or (gpu.healthy, gpu.reason) == (healthy, reason):
                return
            self._gpus[uuid] = GpuInfo(gpu.uuid, gpu.index, gpu.model, gpu.memory_mib,
                                       gpu.numa_node, gpu.architecture, healthy, reason,
                                       gpu.labels)
            current = tuple(sorted(self._gpus.values(), key=lambda g: g.index))
        log.info("GPU %s is now %s %s", uuid, "healthy" if healthy else "unhealthy", reason)
        listener(current)


def _architecture(handle: Any) -> str:
    try:
        return _ARCHITECTURES.get(int(pynvml.nvmlDeviceGetArchitecture(handle)), "unknown")
    except pynvml.NVMLError:
        return "unknown"


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
