"""The NVML backend: a clear error without NVML; every pynvml call it makes exists."""

from __future__ import annotations

import ast
import inspect
import time
from pathlib import Path

import pynvml
import pytest

from gpupool.nodeagent import nvml

from .fake_nvml import FakeNvml

BOARDS = Path(__file__).resolve().parents[2] / "examples" / "boards"


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


def test_nvml_discovery_xid_faults_and_recovery(monkeypatch: pytest.MonkeyPatch) -> None:
    driver = FakeNvml(monkeypatch, BOARDS / "mixed-dgx1-v100.yaml",
                      architecture=pynvml.NVML_DEVICE_ARCH_VOLTA)
    backend = nvml.NvmlGpuBackend(poll_s=0.01, recover_after_s=0.2)
    gpu = backend.discover()[0]
    assert (gpu.uuid, gpu.model, gpu.memory_mib, gpu.numa_node, gpu.architecture) == (
        "GPU-c3000000-0000-0000-0000-000000000000", "V100-SXM2-16GB", 16384, 0, "volta")
    seen: list[tuple[bool, str]] = []
    events = backend._register_events()

    def step() -> None:
        backend._wait_event(events, lambda gs: seen.append((gs[0].healthy, gs[0].reason)))
        backend._poll(lambda gs: seen.append((gs[0].healthy, gs[0].reason)))

    driver.xids = [(0, 13)]  # an application XID: ignored
    step()
    assert seen == []
    driver.xids = [(0, 79)]  # GPU fallen off the bus: unhealthy
    step()
    assert seen == [(False, "critical XID 79")]
    time.sleep(0.25)  # quiet for recover_after_s: healthy again
    step()
    assert seen[-1] == (True, "")
    driver.fail("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_UNKNOWN, gpu=0)
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
