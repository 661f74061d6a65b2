"""The NVML backend: a clear error without NVML; every pynvml call it makes exists."""

from __future__ import annotations

import ast
import inspect

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
