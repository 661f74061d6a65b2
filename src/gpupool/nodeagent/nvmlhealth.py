"""What NVML says of a GPU's condition (``read``) and make (``facts``): nvidia-ml-py.

``read`` asks, for one GPU: memory info (whether NVML can reach it at all), the ECC
counters (``nvmlDeviceGetTotalEccErrors``: corrected and uncorrected, volatile and
aggregate), retired pages pending (``nvmlDeviceGetRetiredPagesPendingStatus``, before
Ampere), remapped rows (``nvmlDeviceGetRemappedRows``, Ampere and later), the clock
event reasons (``nvmlDeviceGetCurrentClocksEventReasons``, or on drivers before 535
``nvmlDeviceGetCurrentClocksThrottleReasons``), PCIe replays
(``nvmlDeviceGetPcieReplayCounter``), temperature, power, clocks and fan speed.

Errors, per signal: ``NVML_ERROR_NOT_SUPPORTED``, ``NVML_ERROR_NO_PERMISSION`` and
``NVML_ERROR_FUNCTION_NOT_FOUND`` (an older driver) leave the signal out and name it in
``GpuReading.unsupported``; ``NVML_ERROR_GPU_IS_LOST`` from any call makes the reading
``lost``; any other error leaves that signal out of this reading only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from gpupool.nodeagent.gpu import GpuFacts
from gpupool.nodeagent.health import GpuReading

log = logging.getLogger(__name__)
T = TypeVar("T")

NOT_WATCHED = {pynvml.NVML_ERROR_NOT_SUPPORTED: "not supported",
               pynvml.NVML_ERROR_NO_PERMISSION: "no permission",
               pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: "driver too old"}
_ECC = {"ecc_volatile_corrected": (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                   pynvml.NVML_VOLATILE_ECC),
        "ecc_volatile_uncorrected": (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                     pynvml.NVML_VOLATILE_ECC),
        "ecc_aggregate_corrected": (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                    pynvml.NVML_AGGREGATE_ECC),
        "ecc_aggregate_uncorrected": (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                      pynvml.NVML_AGGREGATE_ECC)}
_CLOCKS = {"graphics": pynvml.NVML_CLOCK_GRAPHICS, "sm": pynvml.NVML_CLOCK_SM,
           "memory": pynvml.NVML_CLOCK_MEM}


class Lost(Exception):
    """NVML answered ``NVML_ERROR_GPU_IS_LOST``."""


class _Asker:
    """Calls NVML for one GPU, keeping what it could not watch."""

    def __init__(self) -> None:
        self.unsupported: list[str] = []

    def __call__(self, signal: str, fn: Callable[[], T]) -> T | None:
        try:
            return fn()
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise Lost from None
            why = NOT_WATCHED.get(exc.value)
            if why is not None:
                self.unsupported.append(f"{signal} ({why})")
            else:
                log.debug("NVML %s: %s", signal, exc)
            return None


def read(handle: Any, uuid: str) -> GpuReading:
    """One reading of the GPU behind ``handle``."""
    try:
        pynvml.nvmlDeviceGetMemoryInfo(handle)
    except pynvml.NVMLError as exc:
        lost = exc.value == pynvml.NVML_ERROR_GPU_IS_LOST
        return GpuReading(uuid, lost=lost, error="" if lost else str(exc))
    ask = _Asker()
    try:
        values = _signals(handle, ask)
    except Lost:
        return GpuReading(uuid, lost=True)
    return GpuReading(uuid, **values, unsupported=tuple(ask.unsupported))


def _signals(h: Any, ask: _Asker) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (kind, counter) in _ECC.items():
        before = len(ask.unsupported)
        out[name] = ask("ecc", _bind(pynvml.nvmlDeviceGetTotalEccErrors, h, kind, counter))
        if len(ask.unsupported) > before:  # ECC off, or not on this GPU: ask no more
            break
    pending = ask("retired pages", _bind(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, h))
    out["retired_pages_pending"] = None if pending is None else \
        pending == pynvml.NVML_FEATURE_ENABLED
    rows = ask("remapped rows", _bind(pynvml.nvmlDeviceGetRemappedRows, h))
    if rows is not None:
        out["remapped_rows_pending"], out["remapping_failed"] = bool(rows[2]), bool(rows[3])
    out["clock_events"] = _clock_events(h, ask)
    out["pcie_replays"] = ask("pcie replays", _bind(pynvml.nvmlDeviceGetPcieReplayCounter, h))
    out["temperature_c"] = ask("temperature", _bind(pynvml.nvmlDeviceGetTemperature, h,
                                                    pynvml.NVML_TEMPERATURE_GPU))
    milliwatts = ask("power", _bind(pynvml.nvmlDeviceGetPowerUsage, h))
    out["power_w"] = None if milliwatts is None else milliwatts / 1000
    for name, clock in _CLOCKS.items():
        out[f"{name}_clock_mhz"] = ask("clocks", _bind(pynvml.nvmlDeviceGetClockInfo, h, clock))
    out["fan_pct"] = ask("fan", _bind(pynvml.nvmlDeviceGetFanSpeed, h))
    return {k: (int(v) if isinstance(v, int) and not isinstance(v, bool) else v)
            for k, v in out.items()}


def _clock_events(h: Any, ask: _Asker) -> int | None:
    def current() -> int:
        try:
            return int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(h))
        except pynvml.NVMLError as exc:
            if exc.value != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
        return int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))  # before driver 535

    return ask("clock events", current)


def facts(handle: Any, versions: dict[str, str]) -> GpuFacts:
    """The GPU's make; a fact NVML cannot give stays empty (the GPU is served anyway)."""
    ask = _Asker()
    try:
        cc = ask("compute capability", _bind(pynvml.nvmlDeviceGetCudaComputeCapability, handle))
        clocks = {name: ask("max clocks", _bind(pynvml.nvmlDeviceGetMaxClockInfo, handle, c))
                  for name, c in _CLOCKS.items()}
        limit = ask("power limit", _bind(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle))
        gen = ask("pcie", _bind(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, handle))
        width = ask("pcie", _bind(pynvml.nvmlDeviceGetMaxPcieLinkWidth, handle))
    except Lost:
        return GpuFacts(driver_version=versions.get("driverVersion", ""),
                        cuda_version=versions.get("cudaVersion", ""))
    return GpuFacts(f"{cc[0]}.{cc[1]}" if cc else "", int(clocks["graphics"] or 0),
                    int(clocks["sm"] or 0), int(clocks["memory"] or 0),
                    int(limit or 0) // 1000, int(gen or 0), int(width or 0),
                    versions.get("driverVersion", ""), versions.get("cudaVersion", ""))


def _bind(fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    return lambda: fn(*args)
