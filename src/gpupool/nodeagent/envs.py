"""What a container is told about its GPU slice (the Allocate answer), as values.

The answer is assembled from three parts, each a ``ContainerEdits``:

* the slice described (``GPUPOOL_*``: pod, container, mode, GPUs, memory, compute,
  logical devices, isolation provider) — information for the workload and for people;
* the device exposure (``exposure``): how the container runtime is told which GPUs the
  container gets, in a way the container's own environment cannot widen;
* the isolation provider's edits (``isolation``): what enforces the slice's limits.

Kubelet gives a container's own ``env`` precedence over a device plugin's variables,
so no variable here is trusted to limit anything by itself: the agent refuses GPU
containers that set the variables gpupool or its providers use (``exposure``), and
each provider says what enforces it and what does not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpupool.core.allocation import Slice
from gpupool.nodeagent.pods import Pod


@dataclass(frozen=True, slots=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class ContainerEdits:
    """Variables, mounts and CDI device names to add to a container."""

    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    cdi_devices: tuple[str, ...] = ()

    def __add__(self, other: ContainerEdits) -> ContainerEdits:
        return ContainerEdits({**self.envs, **other.envs}, self.mounts + other.mounts,
                              self.cdi_devices + other.cdi_devices)


@dataclass(frozen=True, slots=True)
class ContainerAnswer:
    """Environment, mounts and CDI devices for one container."""

    envs: dict[str, str]
    mounts: tuple[Mount, ...] = field(default=())
    cdi_devices: tuple[str, ...] = field(default=())


def describe(pod: Pod, container: str, slices: Sequence[Slice], exclusive: bool,
             logical: Mapping[str, str], provider: str) -> ContainerEdits:
    """The ``GPUPOOL_*`` variables: the slice, described."""
    uuids = [s.gpu_uuid for s in slices]
    return ContainerEdits({
        "GPUPOOL_POD": pod.ref,
        "GPUPOOL_POD_UID": pod.uid,
        "GPUPOOL_CONTAINER": container,
        "GPUPOOL_MODE": "exclusive" if exclusive else "shared",
        "GPUPOOL_GPU_UUIDS": ",".join(uuids),
        "GPUPOOL_GPU_MEMORY_MIB": ",".join(str(s.memory_mib) for s in slices),
        "GPUPOOL_GPU_CORE_PCT": ",".join(str(s.core_pct) for s in slices),
        "GPUPOOL_GPU_MEMORY_LIMIT_MIB": ",".join(str(s.memory_limit_mib) for s in slices),
        "GPUPOOL_GPU_CORE_LIMIT_PCT": ",".join(str(s.core_limit_pct) for s in slices),
        "GPUPOOL_LOGICAL_DEVICES": ",".join(sorted(logical)),
        "GPUPOOL_ISOLATION": provider,
    })


def answer(*parts: ContainerEdits) -> ContainerAnswer:
    """The Allocate answer of ``parts`` (later parts win on a variable both set)."""
    total = ContainerEdits()
    for part in parts:
        total = total + part
    return ContainerAnswer(dict(total.envs), total.mounts, total.cdi_devices)
