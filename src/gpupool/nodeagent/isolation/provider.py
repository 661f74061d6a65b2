"""The seam every isolation provider implements, and the values it works on."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpupool.contract.isolation import ProviderName
from gpupool.core.allocation import Slice
from gpupool.core.errors import GpupoolError
from gpupool.nodeagent.envs import ContainerEdits
from gpupool.nodeagent.gpu import GpuInfo

NODE_LABEL = "gpupool.io/isolation-provider"
"""Node label naming the provider when ``--isolation-provider auto``; also put on every
GPUDevice's ``spec.labels`` so that resource classes can select enforced GPUs."""


class ProviderRefusal(GpupoolError):
    """The provider cannot enforce this slice here; ``code`` names why (metrics)."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class SliceGrant:
    """One container's slices, as served (one ``Slice`` per GPU)."""

    pod_uid: str
    pod_ref: str
    container: str
    slices: tuple[Slice, ...]
    exclusive: bool


Holdings = Mapping[str, Sequence[Slice]]
"""GPU uuid -> the shared slices that verified decisions hold on it now."""


class ComputeModes(Protocol):
    """The GPU driver's compute mode (NVML), as the GPU backends set it."""

    def set_compute_mode(self, uuid: str, exclusive_process: bool) -> None: ...


class IsolationProvider(Protocol):
    name: ProviderName

    @property
    def enforced(self) -> bool:
        """Whether something on the GPU enforces slices (False: advisory)."""
        ...

    def start(self, gpus: Sequence[GpuInfo], changed: Callable[[], None]) -> None:
        """Prepare the node; ``changed`` is called when ``problems`` change."""
        ...

    def stop(self) -> None: ...

    def edits(self, grant: SliceGrant) -> ContainerEdits:
        """What the container needs for its slice to be enforced; ``ProviderRefusal``."""
        ...

    def sync(self, holdings: Holdings, live_pods: set[str]) -> None:
        """Bring node-wide settings in line with what is held (``live_pods``: their uids)."""
        ...

    def problems(self) -> dict[str, str]:
        """GPU uuid (or ``*``: every GPU) -> why the provider cannot enforce slices there now."""
        ...

