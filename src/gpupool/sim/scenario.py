"""What a simulation replays: a cluster and the pods that arrive, as core values."""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.core.classes import ClassCatalog, ResourceClass
from gpupool.core.model import Node
from gpupool.core.request import PodRequest
from gpupool.core.workload import shape_of

MILLI_PER_GPU = 1000


@dataclass(frozen=True, slots=True)
class TracePod:
    """A pod of a workload: its request and, when known, when it came and went (seconds)."""

    request: PodRequest
    creation_s: float | None = None
    deletion_s: float | None = None


@dataclass(frozen=True, slots=True)
class Scenario:
    """A cluster and a workload, read from files or generated."""

    name: str
    nodes: tuple[Node, ...]
    pods: tuple[TracePod, ...]
    classes: tuple[ResourceClass, ...] = ()

    def __post_init__(self) -> None:
        catalog = ClassCatalog(self.classes)
        for pod in self.pods:
            if pod.request.gpu_class is not None:
                catalog.get(pod.request.gpu_class)  # UnknownName names the known classes

    @property
    def gpu_capacity_milli(self) -> int:
        return sum(len(n.gpus) for n in self.nodes) * MILLI_PER_GPU

    @property
    def requests(self) -> list[PodRequest]:
        return [p.request for p in self.pods]

    @property
    def gpu_demand_milli(self) -> int:
        return sum(demand_milli(p.request) for p in self.pods)


def demand_milli(request: PodRequest) -> int:
    """GPU demand of a request in milli-GPU: GPU count × share of each GPU.

    The share is the core's task shape (``gpupool.core.workload.shape_of``), so
    the simulator counts demand exactly as FGD's target workload does; for the
    Alibaba trace it is ``num_gpu × gpu_milli``.
    """
    if not request.gpus:
        return 0
    shape = shape_of(request)
    return shape.gpu_count * shape.gpu_milli
