"""Per-process GPU usage and compute mode through NVML (nvidia-ml-py's ``pynvml``).

``sample`` asks, for one GPU: its memory in use (``nvmlDeviceGetMemoryInfo``), its
utilisation (``nvmlDeviceGetUtilizationRates``), the compute processes on it with the
memory each holds (``nvmlDeviceGetComputeRunningProcesses``) and each process's SM
utilisation since the previous sample (``nvmlDeviceGetProcessUtilization``, the mean of
the samples NVML kept; a GPU with none since then answers ``NVML_ERROR_NOT_FOUND``).
An NVML error gives a ``GpuUsage`` with ``error`` set: the sample of that GPU is
skipped, never guessed.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pynvml

from gpupool.core.errors import GpupoolError
from gpupool.nodeagent.gpu import GpuUsage, ProcessUsage

MIB = 1024 * 1024


def sample(uuid: str, since_us: int) -> tuple[GpuUsage, int]:
    """(usage of GPU ``uuid``, the timestamp to pass next time)."""
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        used = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used) // MIB
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        sm, last = _process_sm(handle, since_us)
    except pynvml.NVMLError as exc:
        return GpuUsage(uuid, error=f"NVML: {exc}"), since_us
    processes = tuple(ProcessUsage(int(p.pid), int(p.usedGpuMemory or 0) // MIB,
                                   sm.get(int(p.pid))) for p in procs)
    return GpuUsage(uuid, used, _utilization(handle), processes), last


def _utilization(handle: Any) -> int | None:
    try:
        return int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except pynvml.NVMLError:
        return None


def _process_sm(handle: Any, since_us: int) -> tuple[dict[int, int], int]:
    try:
        samples = pynvml.nvmlDeviceGetProcessUtilization(handle, since_us)
    except pynvml.NVMLError as exc:
        if exc.value == pynvml.NVML_ERROR_NOT_FOUND:
            return {}, since_us
        raise
    seen: dict[int, list[int]] = defaultdict(list)
    last = since_us
    for s in samples:
        seen[int(s.pid)].append(int(s.smUtil))
        last = max(last, int(s.timeStamp))
    return {pid: round(sum(v) / len(v)) for pid, v in seen.items()}, last


def set_compute_mode(uuid: str, exclusive_process: bool) -> None:
    """Set the GPU's compute mode (needs root); ``GpupoolError`` says why it could not."""
    mode = (pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS if exclusive_process
            else pynvml.NVML_COMPUTEMODE_DEFAULT)
    try:
        pynvml.nvmlDeviceSetComputeMode(pynvml.nvmlDeviceGetHandleByUUID(uuid), mode)
    except pynvml.NVMLError as exc:
        raise GpupoolError(f"NVML: {exc}") from None
