"""What a container is told about its GPU slice (the Allocate answer).

* ``NVIDIA_VISIBLE_DEVICES``: the decided GPUs' UUIDs (the NVIDIA container
  runtime exposes exactly these).
* Shared slices, for CUDA MPS: ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``
  (``0=4096M,1=4096M``, one entry per visible GPU) and
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (the smallest compute share among the
  slices; MPS takes one value per process). These limit a process only when
  it runs as a client of an MPS control daemon on the node
  (``CUDA_MPS_PIPE_DIRECTORY``, mounted from the host when configured).
* ``GPUPOOL_*``: the slice described for the workload and for monitoring.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpupool.core.allocation import Slice
from gpupool.nodeagent.pods import Pod

MPS_PIPE_IN_CONTAINER = "/tmp/nvidia-mps"


@dataclass(frozen=True, slots=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class ContainerAnswer:
    """Environment and mounts for one container."""

    envs: dict[str, str]
    mounts: tuple[Mount, ...] = field(default=())


def container_answer(pod: Pod, container: str, slices: Sequence[Slice], exclusive: bool,
                     logical: Mapping[str, str], mps_pipe_dir: str = "") -> ContainerAnswer:
    """The answer for ``container`` of ``pod`` holding ``slices`` via logical devices."""
    uuids = [s.gpu_uuid for s in slices]
    envs = {
        "NVIDIA_VISIBLE_DEVICES": ",".join(uuids),
        "GPUPOOL_POD": pod.ref,
        "GPUPOOL_POD_UID": pod.uid,
        "GPUPOOL_CONTAINER": container,
        "GPUPOOL_MODE": "exclusive" if exclusive else "shared",
        "GPUPOOL_GPU_UUIDS": ",".join(uuids),
        "GPUPOOL_GPU_MEMORY_MIB": ",".join(str(s.memory_mib) for s in slices),
        "GPUPOOL_GPU_CORE_PCT": ",".join(str(s.core_pct) for s in slices),
        "GPUPOOL_LOGICAL_DEVICES": ",".join(sorted(logical)),
    }
    if exclusive:
        return ContainerAnswer(envs)
    envs.update(mps_limits(slices))
    if not mps_pipe_dir:
        return ContainerAnswer(envs)
    envs["CUDA_MPS_PIPE_DIRECTORY"] = MPS_PIPE_IN_CONTAINER
    return ContainerAnswer(envs, (Mount(MPS_PIPE_IN_CONTAINER, mps_pipe_dir),))


def mps_limits(slices: Sequence[Slice]) -> dict[str, str]:
    """MPS memory and compute limits for shared slices (device ordinals as the container sees)."""
    out: dict[str, str] = {}
    memory = [f"{i}={s.memory_mib}M" for i, s in enumerate(slices) if s.memory_mib > 0]
    if memory:
        out["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(memory)
    cores = [s.core_pct for s in slices if s.core_pct > 0]
    if cores:
        out["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(min(cores))
    return out
