"""The extender's view of the workload: built-in until 50 GPU pods are seen, then observed."""

from __future__ import annotations

from lightkube.resources.core_v1 import Node

from gpupool.core.allocation import Allocation, Slice
from gpupool.core.model import uniform_node
from gpupool.core.policies import DEFAULT_POLICY
from gpupool.core.request import GpuDemand, Mode, PodRequest
from gpupool.core.state import ClusterState
from gpupool.core.workload import TaskShape
from gpupool.extender.metrics import Metrics
from gpupool.extender.service import Extender, Settings
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.workload import (
    BUILTIN_WORKLOAD,
    MIN_SAMPLES,
    allocation_shape,
    observed_shapes,
    observed_workload,
)

from .builders import gpu_obj, node_obj, pod_obj

GIB = 1024


def state(*names: str, gpus: int = 8) -> ClusterState:
    return ClusterState([uniform_node(n, 96_000, 512 * GIB, gpus, "A100", 40 * GIB)
                         for n in names])


def whole_pod(key: str, count: int = 1, cpu: int = 8000, memory: int = 16 * GIB,
              models: frozenset[str] | None = None) -> PodRequest:
    return PodRequest(key, cpu, memory, (GpuDemand(count, mode=Mode.EXCLUSIVE),), models)


def held(s: ClusterState, key: str, node: str, position: int, core: int = 100,
         memory_mib: int = 40 * GIB, cpu: int = 4000, mem: int = 8 * GIB) -> Allocation:
    gpu = s.nodes[s.node_index(node)].gpus[position]
    alloc = Allocation(key, node, cpu, mem, (Slice(gpu.uuid, position, memory_mib, core),),
                       exclusive=core == 100 and memory_mib == 40 * GIB)
    s.reserve(alloc)
    return alloc


def test_below_fifty_gpu_pods_the_built_in_workload_is_used() -> None:
    s = state("n0")
    recent = [whole_pod(f"p{i}") for i in range(MIN_SAMPLES - 1)]
    recent += [PodRequest("cpu-only", 1000, GIB)]  # not a GPU pod: never counted
    workload, note = observed_workload(s, recent)
    assert workload is BUILTIN_WORKLOAD
    assert note == f"built-in (only {MIN_SAMPLES - 1} GPU pods seen)"


def test_from_fifty_gpu_pods_the_popular_shapes_are_used_with_their_memory() -> None:
    s = state("n0")
    recent = [whole_pod(f"a{i}", memory=16 * GIB) for i in range(30)]
    recent += [whole_pod(f"b{i}", 2, cpu=16_000, memory=64 * GIB) for i in range(20)]
    workload, note = observed_workload(s, recent)
    assert note == "observed (50 GPU pods, 2 shapes)"
    assert workload.shapes == (TaskShape(8000, 1, 1000), TaskShape(16_000, 2, 1000))
    assert workload.weights == (30, 20)
    assert workload.memory_mib == (16 * GIB, 64 * GIB)


def test_held_allocations_count_and_a_pod_both_held_and_recent_counts_once() -> None:
    s = state("n0", "n1")
    for i in range(8):
        held(s, f"h{i}", "n0", i)
    bound = frozenset({"A100"})
    recent = [whole_pod("h0", cpu=4000, memory=8 * GIB, models=bound)]  # also held
    shapes = observed_shapes(s, recent)
    assert len(shapes) == 8
    assert (TaskShape(4000, 1, 1000, bound), 8 * GIB) in shapes  # by its request: models known
    assert shapes.count((TaskShape(4000, 1, 1000), 8 * GIB)) == 7


def test_a_shared_slice_counts_the_larger_of_its_compute_and_memory_share() -> None:
    s = state("n0")
    by_memory = held(s, "m", "n0", 0, core=10, memory_mib=20 * GIB)  # half the 40 GiB GPU
    by_core = held(s, "c", "n0", 1, core=70, memory_mib=4 * GIB)
    assert allocation_shape(s, by_memory) == TaskShape(4000, 1, 500)
    assert allocation_shape(s, by_core) == TaskShape(4000, 1, 700)


def test_shapes_worked_out_once_are_kept_in_the_callers_memo() -> None:
    s = state("n0")
    alloc = held(s, "x", "n0", 0)
    memo: dict[str, tuple[Allocation, TaskShape | None]] = {}
    observed_shapes(s, [], memo)
    assert memo == {"x": (alloc, TaskShape(4000, 1, 1000))}
    s.release("x")
    again = held(s, "x", "n0", 1, core=50, memory_mib=4 * GIB)  # same key, new allocation
    assert observed_shapes(s, [], memo) == [(TaskShape(4000, 1, 500), 8 * GIB)]
    assert memo["x"][0] is again


def test_the_extender_starts_built_in_and_learns_from_the_pods_it_filters() -> None:
    cache = ClusterCache()
    cache.sync_nodes([Node.from_dict(node_obj("n0"))])
    cache.sync_devices([gpu_obj("n0", j) for j in range(8)])
    ext = Extender(cache, Settings(DEFAULT_POLICY), Metrics())
    assert ext.workload_note == "built-in"
    assert ext.refresh_policy() == "built-in (only 0 GPU pods seen)"
    for i in range(MIN_SAMPLES):
        pod = pod_obj(f"p{i}", {"gpupool.io/gpu": "2"}, cpu="6", memory="12Gi")
        pod["metadata"]["uid"] = f"u{i}"
        assert ext.filter({"Pod": pod, "NodeNames": ["n0"]})["NodeNames"] == ["n0"]
    note = ext.refresh_policy()
    assert note == f"observed ({MIN_SAMPLES} GPU pods, 1 shapes)"
    assert ext.workload_note == note
    learned = ext.placer.policy.fgd.frag.workload  # type: ignore[attr-defined]
    assert learned.shapes == (TaskShape(6000, 2, 1000),)
    assert learned.memory_mib == (12 * GIB,)
