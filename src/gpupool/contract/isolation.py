"""The isolation providers' names and the limit variables each one reads, as values.

A node enforces GPU slices through one isolation provider (docs/node-agent.md): the
node agent's providers (``gpupool.nodeagent.isolation``) give local containers these
variables, and the slice server of a remote slice (``gpupool.remote``) gives them to its
data-plane process, so both are limited by the same rule:

* ``mps`` and ``none``: CUDA MPS's client limits, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``
  (``<device ordinal>=<MiB>M``, comma-separated) and
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (the smallest compute share);
* ``hami-core``: HAMi-core's ``CUDA_DEVICE_MEMORY_LIMIT_<ordinal>=<MiB>m`` and
  ``CUDA_DEVICE_SM_LIMIT`` (the smallest compute share).

Device ordinals are the ones the process sees (its visible GPUs, in order); a slice
without memory or compute sets no variable for it. The variables hold a slice's *limit*:
its request, or above it for a burstable slice (``Slice.memory_limit_mib``,
``Slice.core_limit_pct``; the usage monitor reclaims the part above the request when
another slice's request needs the room, docs/design/burst.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from gpupool.core.allocation import Slice


class ProviderName(StrEnum):
    MPS = "mps"
    HAMI_CORE = "hami-core"
    NONE = "none"


def mps_limits(slices: Sequence[Slice]) -> dict[str, str]:
    """MPS memory and compute limits for shared slices (device ordinals as the process sees)."""
    out: dict[str, str] = {}
    memory = [f"{i}={s.memory_limit_mib}M" for i, s in enumerate(slices)
              if s.memory_limit_mib > 0]
    if memory:
        out["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(memory)
    cores = [s.core_limit_pct for s in slices if s.core_limit_pct > 0]
    if cores:
        out["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(min(cores))
    return out


def hami_core_limits(slices: Sequence[Slice]) -> dict[str, str]:
    """HAMi-core's memory limit per visible GPU and its SM limit for shared slices."""
    out = {f"CUDA_DEVICE_MEMORY_LIMIT_{i}": f"{s.memory_limit_mib}m"
           for i, s in enumerate(slices) if s.memory_limit_mib > 0}
    cores = [s.core_limit_pct for s in slices if s.core_limit_pct > 0]
    if cores:
        out["CUDA_DEVICE_SM_LIMIT"] = str(min(cores))
    return out


def limits(provider: ProviderName, slices: Sequence[Slice]) -> dict[str, str]:
    """The limit variables ``provider`` reads for ``slices``."""
    if provider is ProviderName.HAMI_CORE:
        return hami_core_limits(slices)
    return mps_limits(slices)
