"""A physical GPU as the node agent sees it, and the backend seam that finds them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gpupool.contract import names
from gpupool.core.mig import MigDevice, MigMode
from gpupool.core.model import Gpu, freeze_labels
from gpupool.core.topology import GpuLinks

if TYPE_CHECKING:
    from gpupool.nodeagent.health import GpuReading

HEALTHY = names.DEVICE_HEALTHY  # GPUDevice status.health, and the device plugin API's
UNHEALTHY = names.DEVICE_UNHEALTHY
DEGRADED = "Degraded"  # GPUDevice status.healthLevel only: healthy, with a condition


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """What a GPU is made of beyond its memory (published on its ``GPUDevice``); a fact
    NVML does not report stays empty (0 or "")."""

    compute_capability: str = ""  # "9.0"
    max_graphics_clock_mhz: int = 0
    max_sm_clock_mhz: int = 0
    max_memory_clock_mhz: int = 0
    power_limit_w: int = 0  # the enforced power limit
    pcie_generation: int = 0  # the highest the GPU and its slot reach together
    pcie_width: int = 0
    driver_version: str = ""
    cuda_version: str = ""  # "12.4"


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One physical GPU: identity, capacity, topology and current health.

    ``healthy`` False: unhealthy (``reason`` says why); healthy with ``degraded`` set:
    still serving, with the conditions ``gpupool.nodeagent.health`` calls degrading."""

    uuid: str
    index: int
    model: str
    memory_mib: int
    numa_node: int = 0
    architecture: str = "unknown"
    healthy: bool = True
    reason: str = ""
    labels: tuple[tuple[str, str], ...] = field(default=())
    links: GpuLinks = ()
    facts: GpuFacts = field(default_factory=GpuFacts)
    degraded: str = ""
    mig: MigMode | MigDevice | None = None
    """MIG (``nodeagent.mig``): a GPU in MIG mode (its MIG devices in ``instances``), one
    of its MIG devices as the agent serves it, or None."""

    @property
    def health(self) -> str:
        return HEALTHY if self.healthy else UNHEALTHY

    @property
    def level(self) -> str:
        """``Healthy``, ``Degraded`` or ``Unhealthy`` (``GPUDevice`` ``status.healthLevel``)."""
        return UNHEALTHY if not self.healthy else DEGRADED if self.degraded else HEALTHY

    def to_core(self) -> Gpu:
        """The core's model of this GPU (capacity, topology, health, labels, links)."""
        mig = MigMode() if isinstance(self.mig, MigMode) else self.mig
        return Gpu(self.uuid, self.index, self.model, self.memory_mib, self.numa_node,
                   self.healthy, freeze_labels(dict(self.labels)), self.links, mig)


@dataclass(frozen=True, slots=True)
class ProcessUsage:
    """One process on one GPU: memory it holds and its SM utilisation (None: no sample)."""

    pid: int
    memory_mib: int
    sm_pct: int | None = None


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """One GPU's usage sample; ``error`` says why it could not be taken (then skipped)."""

    uuid: str
    memory_used_mib: int = 0
    utilization_pct: int | None = None
    processes: tuple[ProcessUsage, ...] = ()
    error: str = ""


HealthListener = Callable[[tuple[GpuInfo, ...]], None]
"""Called with the full, current list of GPUs whenever any of them changes."""


class GpuBackend(Protocol):
    """Where GPUs come from: NVML on a real node, a YAML file in tests and demos."""

    def discover(self) -> tuple[GpuInfo, ...]:
        """The GPUs present now, ordered by index."""
        ...

    def watch(self, listener: HealthListener) -> None:
        """Start watching health; call ``listener`` with the full list on every change."""
        ...

    def close(self) -> None:
        """Stop watching and release the driver."""
        ...

    def usage(self) -> tuple[GpuUsage, ...]:
        """Memory and utilisation of every GPU and of the processes on it, now."""
        ...

    def readings(self) -> tuple[GpuReading, ...]:
        """The latest health and telemetry reading of every GPU (``health.GpuReading``)."""
        ...

    def set_compute_mode(self, uuid: str, exclusive_process: bool) -> None:
        """``EXCLUSIVE_PROCESS`` (only one process, e.g. the MPS server, may open a context)
        or ``DEFAULT``; raises ``GpupoolError`` saying why it could not."""
        ...
