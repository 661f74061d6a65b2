"""The NVML backend: a clear error without NVML; every pynvml call it makes exists."""

from __future__ import annotations

import ast
import inspect
import time

import pynvml
import pytest

from gpupool.nodeagent import nvml


def nvml_loads() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(nvml_loads(), reason="this machine has NVML")
def test_without_nvml_the_backend_says_what_to_do() -> None:
    with pytest.raises(nvml.NvmlUnavailable, match=r"NVML is not available .*--fake-gpus"):
        nvml.NvmlGpuBackend()


def test_every_pynvml_name_the_backend_uses_exists_in_nvidia_ml_py() -> None:
    tree = ast.parse(inspect.getsource(nvml))
    used = {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "pynvml"}
    assert {"nvmlEventSetWait_v2", "nvmlDeviceRegisterEvents",
            "nvmlEventTypeXidCriticalError"} <= used
    assert sorted(name for name in used if not hasattr(pynvml, name)) == []


class _Driver:
    """FAKE libnvidia-ml behind pynvml's functions (one GPU, scripted XID events).

    Only the C library is replaced: return values are pynvml's own ctypes
    structures and errors are pynvml's own exception classes, so the backend's
    handling of them is what runs on a node.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.events: list[int] = []
        self.lost = False
        memory = pynvml.c_nvmlMemory_t()
        memory.total = 80 * 1024 ** 3
        calls = {
            "nvmlInit": lambda: None, "nvmlShutdown": lambda: None,
            "nvmlDeviceGetCount": lambda: 1, "nvmlDeviceGetHandleByIndex": lambda i: "h0",
            "nvmlDeviceGetHandleByUUID": lambda u: "h0",
            "nvmlDeviceGetUUID": lambda h: b"GPU-aaaa",
            "nvmlDeviceGetName": lambda h: "NVIDIA A100-SXM4-80GB",
            "nvmlDeviceGetMemoryInfo": self._memory(memory),
            "nvmlDeviceGetNumaNodeId": lambda h: 1,
            "nvmlDeviceGetArchitecture": lambda h: pynvml.NVML_DEVICE_ARCH_AMPERE,
            "nvmlEventSetCreate": lambda: "set", "nvmlDeviceRegisterEvents": lambda h, t, s: None,
            "nvmlEventSetWait_v2": self._wait,
        }
        for name, fn in calls.items():
            monkeypatch.setattr(pynvml, name, fn)

    def _memory(self, memory: object) -> object:
        def get(handle: object) -> object:
            if self.lost:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
            return memory
        return get

    def _wait(self, event_set: object, timeout_ms: int) -> object:
        if not self.events:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        data = pynvml.c_nvmlEventData_t()
        data.eventType = pynvml.nvmlEventTypeXidCriticalError
        data.eventData = self.events.pop(0)
        return data


def test_nvml_discovery_xid_faults_and_recovery(monkeypatch: pytest.MonkeyPatch) -> None:
    driver = _Driver(monkeypatch)
    backend = nvml.NvmlGpuBackend(poll_s=0.01, recover_after_s=0.2)
    (gpu,) = backend.discover()
    assert (gpu.uuid, gpu.model, gpu.memory_mib, gpu.numa_node, gpu.architecture) == (
        "GPU-aaaa", "A100-SXM4-80GB", 81920, 1, "ampere")
    seen: list[tuple[bool, str]] = []
    events = backend._register_events()

    def step() -> None:
        backend._wait_event(events, lambda gs: seen.append((gs[0].healthy, gs[0].reason)))
        backend._poll(lambda gs: seen.append((gs[0].healthy, gs[0].reason)))

    driver.events = [13]  # an application XID: ignored
    step()
    assert seen == []
    driver.events = [79]  # GPU fallen off the bus: unhealthy
    step()
    assert seen == [(False, "critical XID 79")]
    time.sleep(0.25)  # quiet for recover_after_s: healthy again
    step()
    assert seen[-1] == (True, "")
    driver.lost = True
    step()
    assert not seen[-1][0] and "NVML cannot query the GPU" in seen[-1][1]


def test_every_pynvml_name_the_usage_sampler_uses_exists_in_nvidia_ml_py() -> None:
    from gpupool.nodeagent import nvmlusage

    tree = ast.parse(inspect.getsource(nvmlusage))
    used = {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "pynvml"}
    assert {"nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetProcessUtilization",
            "nvmlDeviceSetComputeMode"} <= used
    assert sorted(name for name in used if not hasattr(pynvml, name)) == []


def _usage_driver(monkeypatch: pytest.MonkeyPatch, samples: object) -> None:
    """FAKE libnvidia-ml for one GPU with two processes (pynvml's own structures)."""
    memory = pynvml.c_nvmlMemory_t()
    memory.used = 5000 * 1024 ** 2
    rates = pynvml.c_nvmlUtilization_t()
    rates.gpu = 77
    procs = []
    for pid, used in ((11, 3000), (12, None)):
        p = pynvml.c_nvmlProcessInfo_v3_t()
        p.pid = pid
        procs.append(pynvml.nvmlStructToFriendlyObject(p))
        procs[-1].usedGpuMemory = used * 1024 ** 2 if used else None
    calls = {
        "nvmlDeviceGetHandleByUUID": lambda u: "h0",
        "nvmlDeviceGetMemoryInfo": lambda h: memory,
        "nvmlDeviceGetUtilizationRates": lambda h: rates,
        "nvmlDeviceGetComputeRunningProcesses": lambda h: procs,
        "nvmlDeviceGetProcessUtilization": samples,
    }
    for name, fn in calls.items():
        monkeypatch.setattr(pynvml, name, fn)


def test_a_usage_sample_reads_processes_memory_and_sm_utilisation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gpupool.nodeagent import nvmlusage

    def samples(handle: object, since: int) -> list[object]:
        out = []
        for pid, sm, ts in ((11, 40, 5), (11, 60, 9), (12, 10, 7)):
            s = pynvml.c_nvmlProcessUtilizationSample_t()
            s.pid, s.smUtil, s.timeStamp = pid, sm, ts
            out.append(s)
        return out
    _usage_driver(monkeypatch, samples)
    usage, last = nvmlusage.sample("GPU-aaaa", 0)
    assert (usage.memory_used_mib, usage.utilization_pct, last) == (5000, 77, 9)
    assert [(p.pid, p.memory_mib, p.sm_pct) for p in usage.processes] == [
        (11, 3000, 50), (12, 0, 10)]


def test_no_utilisation_samples_and_nvml_errors_are_values_not_crashes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gpupool.nodeagent import nvmlusage

    def none_yet(handle: object, since: int) -> list[object]:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
    _usage_driver(monkeypatch, none_yet)
    usage, last = nvmlusage.sample("GPU-aaaa", 3)
    assert last == 3 and [p.sm_pct for p in usage.processes] == [None, None]

    def lost(handle: object) -> object:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", lost)
    usage, _ = nvmlusage.sample("GPU-aaaa", 3)
    assert usage.error.startswith("NVML: ") and usage.processes == ()

    def refused(handle: object, mode: int) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
    monkeypatch.setattr(pynvml, "nvmlDeviceSetComputeMode", refused)
    with pytest.raises(Exception, match="NVML: "):
        nvmlusage.set_compute_mode("GPU-aaaa", True)
