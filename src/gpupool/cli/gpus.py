"""The node's GPUs, as ``gpupool device-plugin`` and ``gpupool mps-helper`` find them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpupool.nodeagent.gpu import GpuBackend


def gpu_backend(fake_gpus: Path | None) -> GpuBackend:
    """From the fake GPU file (read and checked now), else through NVML (which must answer
    now); each backend's module is imported only here."""
    if fake_gpus:
        from gpupool.nodeagent.fakegpus import FakeGpuBackend

        return FakeGpuBackend(fake_gpus)
    from gpupool.nodeagent.nvml import NvmlGpuBackend

    return NvmlGpuBackend()
