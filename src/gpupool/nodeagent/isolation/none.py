"""``none``: advisory isolation — nothing on the GPU enforces a slice.

Shared containers are told their limits in the CUDA MPS variables
(``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``), which
take effect only if the node runs an MPS control daemon the container reaches on its
own; the usage monitor still detects a container that uses more than its slice and
applies the configured action. Named ``none`` in metrics, docs, the node label and
``GPUDevice`` status, so nobody mistakes it for enforcement.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpupool.contract.isolation import ProviderName, mps_limits
from gpupool.nodeagent.envs import ContainerEdits
from gpupool.nodeagent.gpu import GpuInfo
from gpupool.nodeagent.isolation.provider import Holdings, SliceGrant


class NoIsolation:
    """The advisory provider."""

    name = ProviderName.NONE

    @property
    def enforced(self) -> bool:
        return False

    def start(self, gpus: Sequence[GpuInfo], changed: Callable[[], None]) -> None:
        return None

    def stop(self) -> None:
        return None

    def edits(self, grant: SliceGrant) -> ContainerEdits:
        if grant.exclusive:
            return ContainerEdits()
        return ContainerEdits(mps_limits(grant.slices))

    def sync(self, holdings: Holdings, live_pods: set[str]) -> None:
        return None

    def problems(self) -> dict[str, str]:
        return {}
