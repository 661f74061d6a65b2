"""Nodes and GPUs as frozen values (capacities; what is free lives in ``state``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpupool.core.errors import InvalidInput
from gpupool.core.mig import LABEL_MODE, LABEL_PARENT, LABEL_PROFILE, MigDevice, MigMode
from gpupool.core.topology import GpuLinks

CORE_UNITS_PER_GPU = 100
"""Compute of one GPU in units of 1 %."""

DEFAULT_MEMORY_UNIT_MIB = 256
"""GPU memory is accounted in units of this many MiB unless configured."""

Labels = tuple[tuple[str, str], ...]


def freeze_labels(labels: Mapping[str, str] | None) -> Labels:
    """Labels as a sorted tuple of pairs, so model values stay hashable."""
    return tuple(sorted((str(k), str(v)) for k, v in (labels or {}).items()))


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU: identity, capacity, the labels class selectors read, and its
    links to the other GPUs of its node (``core.topology``; empty: not known)."""

    uuid: str
    index: int
    model: str
    memory_mib: int
    numa_node: int = 0
    healthy: bool = True
    labels: Labels = ()
    links: GpuLinks = ()
    mig: MigMode | MigDevice | None = None
    """MIG (``core.mig``): a GPU in MIG mode (never handed out itself), one of its MIG
    devices (handed out whole, to pods asking its profile), or None: an ordinary GPU."""

    def __post_init__(self) -> None:
        if not self.uuid:
            raise InvalidInput("a GPU needs a uuid")
        if self.memory_mib <= 0:
            raise InvalidInput(
                f"GPU {self.uuid}: memory_mib must be positive, got {self.memory_mib}"
            )
        if self.index < 0:
            raise InvalidInput(f"GPU {self.uuid}: index must be >= 0")

    def label_map(self) -> dict[str, str]:
        """Labels for selectors, including the built-in ``gpupool.io/*`` facts."""
        merged = {
            "gpupool.io/model": self.model,
            "gpupool.io/memory": f"{self.memory_mib}Mi",
            "gpupool.io/index": str(self.index),
        }
        if isinstance(self.mig, MigDevice):
            merged[LABEL_PROFILE] = self.mig.profile
            merged[LABEL_PARENT] = self.mig.parent
        elif self.mig is not None:
            merged[LABEL_MODE] = "enabled"
        merged.update(dict(self.labels))
        return merged

    @property
    def mig_profile(self) -> str:
        """The profile of a MIG device ("" for any other GPU)."""
        return self.mig.profile if isinstance(self.mig, MigDevice) else ""

    @property
    def in_mig_mode(self) -> bool:
        """A GPU in MIG mode: only its MIG devices are handed out."""
        return isinstance(self.mig, MigMode)


@dataclass(frozen=True, slots=True)
class Node:
    """One machine: CPU (milli-cores), memory (MiB) and its GPUs."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[Gpu, ...] = ()
    labels: Labels = ()
    numa_nodes: int = field(default=1)

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidInput("a node needs a name")
        if self.cpu_milli < 0 or self.memory_mib < 0:
            raise InvalidInput(f"node {self.name}: CPU and memory must be >= 0")
        uuids = [g.uuid for g in self.gpus]
        if len(set(uuids)) != len(uuids):
            raise InvalidInput(f"node {self.name}: duplicate GPU uuid")

    @property
    def model(self) -> str:
        """The GPU model of the node ('' without GPUs; the first GPU's if mixed)."""
        return self.gpus[0].model if self.gpus else ""


def uniform_node(
    name: str,
    cpu_milli: int,
    memory_mib: int,
    gpu_count: int,
    model: str,
    gpu_memory_mib: int,
    labels: Mapping[str, str] | None = None,
) -> Node:
    """A node with ``gpu_count`` identical GPUs with derived uuids (trace and demo clusters)."""
    numa = 2 if gpu_count >= 4 else 1
    gpus = tuple(
        Gpu(
            uuid=f"GPU-{name}-{i}",
            index=i,
            model=model,
            memory_mib=gpu_memory_mib,
            numa_node=(i * numa) // max(gpu_count, 1),
        )
        for i in range(gpu_count)
    )
    return Node(name, cpu_milli, memory_mib, gpus, freeze_labels(labels), numa)
