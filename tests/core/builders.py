"""Small builders for core tests: nodes, clusters, pods and reservations in one line each."""

from __future__ import annotations

from gpupool.core.allocation import Allocation, Slice
from gpupool.core.model import Gpu, Node, freeze_labels, uniform_node
from gpupool.core.request import Affinity, GpuDemand, Mode, PodRequest
from gpupool.core.selector import Selector
from gpupool.core.state import ClusterState

GIB = 1024


def node(name: str, gpus: int = 4, model: str = "A100", gpu_gib: int = 40, cpu: int = 32000,
         mem_gib: int = 256, labels: dict[str, str] | None = None) -> Node:
    """A node of ``gpus`` identical GPUs (uuids ``GPU-<name>-<i>``)."""
    return uniform_node(name, cpu, mem_gib * GIB, gpus, model, gpu_gib * GIB, labels)


def gpu(uuid: str, index: int, model: str = "A100", gpu_gib: int = 40, numa: int = 0,
        labels: dict[str, str] | None = None, healthy: bool = True) -> Gpu:
    return Gpu(uuid, index, model, gpu_gib * GIB, numa, healthy, freeze_labels(labels))


def mixed(name: str, *gpus: Gpu, cpu: int = 32000, mem_gib: int = 256) -> Node:
    return Node(name, cpu, mem_gib * GIB, tuple(gpus))


def cluster(*nodes: Node, unit_mib: int = 256) -> ClusterState:
    return ClusterState(nodes, memory_unit_mib=unit_mib)


def whole(count: int = 1, container: str = "") -> GpuDemand:
    return GpuDemand(count, mode=Mode.EXCLUSIVE, container=container)


def shared(count: int = 1, mib: int = 0, core: int = 0, container: str = "") -> GpuDemand:
    return GpuDemand(count, mib, core, Mode.SHARED, container)


def pod(key: str = "p", *demands: GpuDemand, cpu: int = 1000, mem: int = 1024,
        models: set[str] | None = None, group: str | None = None, tenant: str | None = None,
        gpu_class: str | None = None, selector: Selector | None = None,
        affinity: Affinity = Affinity.LEAST_LOADED) -> PodRequest:
    return PodRequest(key, cpu, mem, tuple(demands), None if models is None else frozenset(models),
                      selector, group, tenant, affinity, gpu_class)


def hold(state: ClusterState, key: str, node_name: str, *slices: tuple[int, int, int],
         cpu: int = 0, mem: int = 0) -> Allocation:
    """Reserve (position, MiB, core %) slices on ``node_name`` under ``key``."""
    n = state.nodes[state.node_index(node_name)]
    alloc = Allocation(key, node_name, cpu, mem,
                       tuple(Slice(n.gpus[p].uuid, p, mib, core) for p, mib, core in slices))
    state.reserve(alloc)
    return alloc


def hold_whole(state: ClusterState, key: str, node_name: str, *positions: int) -> Allocation:
    """Reserve whole GPUs at ``positions`` (all memory and compute)."""
    n = state.nodes[state.node_index(node_name)]
    return hold(state, key, node_name, *((p, n.gpus[p].memory_mib, 100) for p in positions))
