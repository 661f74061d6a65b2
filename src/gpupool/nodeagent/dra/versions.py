"""Driver and CUDA versions for the devices' attributes, when NVML has them."""

from __future__ import annotations

import logging

import pynvml

log = logging.getLogger(__name__)


def nvml_versions() -> dict[str, str]:
    """``driverVersion`` and ``cudaVersion`` (``12.4``) from NVML; {} where NVML has none
    (no driver, or not initialised by the NVML backend)."""
    out: dict[str, str] = {}
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        out["driverVersion"] = driver.decode() if isinstance(driver, bytes) else str(driver)
        cuda = int(pynvml.nvmlSystemGetCudaDriverVersion())
        out["cudaVersion"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
    except pynvml.NVMLError as exc:
        log.info("driver and CUDA versions not published: %s", exc)
    return out
