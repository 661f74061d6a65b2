"""FAKE libnvidia-ml behind pynvml's functions, built from a fake GPU file (the board).

Only the C library is replaced: return values are pynvml's own ctypes structures and
errors pynvml's own exception classes, so the backend's handling of them is what runs
on a node. The board's ``topology`` becomes NVLink links (``NV<n>``: ``n`` links to the
peer, or with ``switch=True`` to NVSwitches, joined by the P2P status) and PCIe
common ancestors; a GPU's ``telemetry`` becomes its health readings.

``fail(function, error, gpu=None)`` makes a function answer an NVML error (for one GPU
or all); ``xids`` queues XID events.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpupool.core.topology import PciePath
from gpupool.nodeagent import fakegpus
from gpupool.nodeagent.fakeboard import WORDS

Handle = str


class FakeNvml:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, board: Path, switch: bool = False,
                 architecture: int = pynvml.NVML_DEVICE_ARCH_HOPPER):
        body = fakegpus.load_file(board)
        self.entries = sorted(body["gpus"], key=lambda e: int(e.get("index", 0)))
        self.matrix: list[list[str]] = body.get("topology") or []
        self.version = int(body.get("nvlinkVersion", 0))
        self.switch = switch
        self.architecture = architecture
        self.errors: dict[tuple[str, int | None], int] = {}
        self.xids: list[tuple[int, int]] = []  # (GPU index, XID)
        self.calls: set[str] = set()
        self._event_gpu = 0
        for name, fn in self._functions().items():
            monkeypatch.setattr(pynvml, name, self._wrapped(name, fn))

    # -- control -------------------------------------------------------------------
    def fail(self, function: str, error: int, gpu: int | None = None) -> None:
        self.errors[(function, gpu)] = error

    def heal(self) -> None:
        self.errors.clear()

    @property
    def names(self) -> set[str]:
        return set(self._functions())

    def bus(self, i: int) -> str:
        return f"00000000:{0x10 + i:02X}:00.0"

    def telemetry(self, i: int) -> dict[str, Any]:
        return dict(self.entries[i].get("telemetry") or {})

    # -- plumbing ------------------------------------------------------------------
    def _wrapped(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            self.calls.add(name)
            gpus = [int(a[1:]) for a in args if isinstance(a, str) and a.startswith("h")]
            for key in [(name, None), *((name, g) for g in gpus)]:
                if key in self.errors:
                    raise pynvml.NVMLError(self.errors[key])
            return fn(*args)
        return call

    def _i(self, handle: Handle) -> int:
        return int(handle[1:])

    def _functions(self) -> dict[str, Callable[..., Any]]:
        return {
            "nvmlInit": lambda: None, "nvmlShutdown": lambda: None,
            "nvmlDeviceGetCount": lambda: len(self.entries),
            "nvmlDeviceGetHandleByIndex": lambda i: f"h{i}",
            "nvmlDeviceGetHandleByUUID": self._by_uuid,
            "nvmlDeviceGetUUID": self._uuid,
            "nvmlDeviceGetName": lambda h: "NVIDIA " + str(self.entries[self._i(h)]["model"]),
            "nvmlDeviceGetMemoryInfo": self._memory,
            "nvmlDeviceGetNumaNodeId": lambda h: int(self.entries[self._i(h)].get("numaNode", 0)),
            "nvmlDeviceGetArchitecture": lambda h: self.architecture,
            "nvmlDeviceGetPciInfo": self._pci,
            "nvmlSystemGetDriverVersion": lambda: "550.54.15",
            "nvmlSystemGetCudaDriverVersion": lambda: 12040,
            "nvmlDeviceGetCudaComputeCapability": lambda h: (9, 0),
            "nvmlDeviceGetMaxClockInfo": lambda h, c: {pynvml.NVML_CLOCK_GRAPHICS: 1980,
                                                       pynvml.NVML_CLOCK_SM: 1980,
                                                       pynvml.NVML_CLOCK_MEM: 2619}[c],
            "nvmlDeviceGetEnforcedPowerLimit": lambda h: 700_000,
            "nvmlDeviceGetMaxPcieLinkGeneration": lambda h: 5,
            "nvmlDeviceGetMaxPcieLinkWidth": lambda h: 16,
            "nvmlDeviceGetNvLinkState": self._link_state,
            "nvmlDeviceGetNvLinkRemoteDeviceType": self._remote_type,
            "nvmlDeviceGetNvLinkRemotePciInfo": self._remote_pci,
            "nvmlDeviceGetNvLinkVersion": lambda h, link: self._nvml_version(),
            "nvmlDeviceGetP2PStatus": self._p2p,
            "nvmlDeviceGetTopologyCommonAncestor": self._ancestor,
            "nvmlDeviceGetTotalEccErrors": self._ecc,
            "nvmlDeviceGetRetiredPagesPendingStatus": lambda h: int(bool(
                self.telemetry(self._i(h)).get("retiredPagesPending"))),
            "nvmlDeviceGetRemappedRows": self._rows,
            "nvmlDeviceGetCurrentClocksEventReasons": self._clock_events,
            "nvmlDeviceGetCurrentClocksThrottleReasons": self._clock_events,
            "nvmlDeviceGetPcieReplayCounter": lambda h: int(
                self.telemetry(self._i(h)).get("pcieReplays", 0)),
            "nvmlDeviceGetTemperature": lambda h, sensor: int(
                self.telemetry(self._i(h)).get("temperatureC", 35)),
            "nvmlDeviceGetPowerUsage": lambda h: int(
                float(self.telemetry(self._i(h)).get("powerW", 90.5)) * 1000),
            "nvmlDeviceGetClockInfo": lambda h, c: 1410,
            "nvmlDeviceGetFanSpeed": lambda h: 30,
            "nvmlEventSetCreate": lambda: "set",
            "nvmlDeviceRegisterEvents": lambda h, kinds, events: None,
            "nvmlEventSetWait_v2": self._wait,
            "nvmlDeviceGetMigMode": self._no_mig,  # fake_nvml_mig answers for MIG GPUs
        }

    # -- identity and memory ---------------------------------------------------------
    def _by_uuid(self, uuid: str | bytes) -> Handle:
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for i, e in enumerate(self.entries):
            if e["uuid"] == text:
                return f"h{i}"
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def _uuid(self, h: object) -> bytes:
        i = self._i(h) if isinstance(h, str) else self._event_gpu  # else: an event's device
        return str(self.entries[i]["uuid"]).encode()

    def _memory(self, h: Handle) -> Any:
        i = self._i(h)
        if self.telemetry(i).get("lost"):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        memory = pynvml.c_nvmlMemory_t()
        memory.total = int(self.entries[i]["memoryMiB"]) * 1024 ** 2
        return memory

    def _pci(self, h: Handle) -> Any:
        info = pynvml.nvmlPciInfo_t()
        info.busId = self.bus(self._i(h)).encode()
        return info

    # -- NVLink and PCIe ------------------------------------------------------------------
    def _ends(self, i: int) -> list[int | None]:
        """Peer index per NVLink link of GPU ``i`` (None: an NVSwitch)."""
        if not self.matrix:
            return []
        out: list[int | None] = []
        for j, word in enumerate(self.matrix[i]):
            if word.startswith("NV"):
                out += [None if self.switch else j] * int(word[2:])
        if self.switch:  # as many links to the switches as to the best-joined peer
            best = max((int(w[2:]) for w in self.matrix[i] if w.startswith("NV")), default=0)
            out = [None] * best
        return out

    def _link_state(self, h: Handle, link: int) -> int:
        ends = self._ends(self._i(h))
        if not ends:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= len(ends):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED

    def _remote_type(self, h: Handle, link: int) -> int:
        end = self._ends(self._i(h))[link]
        return pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH if end is None else \
            pynvml.NVML_NVLINK_DEVICE_TYPE_GPU

    def _remote_pci(self, h: Handle, link: int) -> Any:
        end = self._ends(self._i(h))[link]
        info = pynvml.nvmlPciInfo_t()
        info.busId = (b"00000000:F0:00.0" if end is None else self.bus(end).encode())
        return info

    def _nvml_version(self) -> int:
        return {1: pynvml.NVML_NVLINK_VERSION_1_0, 2: pynvml.NVML_NVLINK_VERSION_2_0,
                3: pynvml.NVML_NVLINK_VERSION_3_0, 4: pynvml.NVML_NVLINK_VERSION_4_0,
                5: pynvml.NVML_NVLINK_VERSION_5_0}.get(self.version,
                                                       pynvml.NVML_NVLINK_VERSION_INVALID)

    def _p2p(self, a: Handle, b: Handle, index: int) -> int:
        assert index == pynvml.NVML_P2P_CAPS_INDEX_NVLINK
        word = self.matrix[self._i(a)][self._i(b)]
        return pynvml.NVML_P2P_STATUS_OK if word.startswith("NV") else \
            pynvml.NVML_P2P_STATUS_NOT_SUPPORTED

    def _ancestor(self, a: Handle, b: Handle) -> int:
        if not self.matrix:
            return int(PciePath.SYSTEM)
        word = self.matrix[self._i(a)][self._i(b)]
        return int(WORDS.get(word, PciePath.NUMA_NODE))  # NV pairs: one NUMA node's bridges

    # -- health -------------------------------------------------------------------------
    def _ecc(self, h: Handle, kind: int, counter: int) -> int:
        t = self.telemetry(self._i(h))
        key = ("eccVolatile" if counter == pynvml.NVML_VOLATILE_ECC else "eccAggregate") + \
            ("Corrected" if kind == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else "Uncorrected")
        return int(t.get(key, 0))

    def _rows(self, h: Handle) -> tuple[int, int, int, int]:
        t = self.telemetry(self._i(h))
        return (0, 0, int(bool(t.get("remappedRowsPending"))),
                int(bool(t.get("remappingFailed"))))

    def _clock_events(self, h: Handle) -> int:
        from gpupool.nodeagent.health import CLOCK_EVENTS
        bits = {name: bit for bit, (name, _) in CLOCK_EVENTS.items()}
        return sum(bits[e] for e in self.telemetry(self._i(h)).get("clockEvents") or ())

    def _no_mig(self, h: Handle) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # GPUs without MIG

    def _wait(self, event_set: object, timeout_ms: int) -> Any:
        if not self.xids:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        gpu, xid = self.xids.pop(0)
        data = pynvml.c_nvmlEventData_t()
        data.eventType = pynvml.nvmlEventTypeXidCriticalError
        data.eventData = xid
        self._event_gpu = gpu  # the event's device reads as None
        return data
