"""The simulator's model of DRA's own allocation (kube-scheduler's default scores, first-fit
devices) against gpupool's choice, on tiny clusters and the built-in synthetic one."""

from __future__ import annotations

import numpy as np
import pytest

from gpupool.core.classes import ClassCatalog
from gpupool.core.errors import UnknownName
from gpupool.core.model import uniform_node
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.request import GpuDemand, Mode, PodRequest
from gpupool.core.state import ClusterState
from gpupool.core.workload import TargetWorkload
from gpupool.sim.dra import VARIANTS, DraDecider, extender_scores, kube_scores, run_variant
from gpupool.sim.protocol import run_protocol
from gpupool.sim.synthetic import synthetic_scenario


def shared(key: str, core: int, cpu: int = 1000) -> PodRequest:
    return PodRequest(key, cpu, 1024, (GpuDemand(1, 0, core, Mode.SHARED),))


def two_nodes() -> ClusterState:
    return ClusterState([uniform_node("a", 32_000, 128_000, 2, "A100", 40960),
                         uniform_node("b", 32_000, 128_000, 2, "A100", 40960)])


def decider(state: ClusterState, variant: str, policy: str = "best-fit") -> DraDecider:
    config = PolicyConfig(TargetWorkload.from_requests([shared("w", 50)]))
    return DraDecider(state, VARIANTS[variant], policy, config, 42, ClassCatalog())


def test_kube_schedulers_default_scores_favour_the_node_with_more_cpu_and_memory_free() -> None:
    state = two_nodes()
    state.reserve(decider(state, "gpupool").decide(shared("busy", 10, cpu=16_000)) or
                  pytest.fail("no room"))
    busy = state.index["a"] if state.cpu_free[state.index["a"]] < 32_000 else state.index["b"]
    scores = kube_scores(state, shared("p", 10), np.arange(2))
    assert scores[busy] < scores[1 - busy]
    assert scores.min() >= 0 and scores.max() <= 200


def test_dra_first_fit_spreads_slices_where_gpupool_packs_them() -> None:
    dra, pool = two_nodes(), two_nodes()
    for k in range(2):  # two 30 % slices, one after the other
        for state, variant in ((dra, "dra-first-fit"), (pool, "gpupool")):
            alloc = decider(state, variant).decide(shared(f"p{k}", 30))
            assert alloc is not None
            state.reserve(alloc)
    assert len({a.node for a in dra.allocations.values()}) == 2  # LeastAllocated spreads
    assert len({s.gpu_uuid for a in pool.allocations.values() for s in a.slices}) == 1


def test_first_fit_takes_the_lowest_index_device_with_room() -> None:
    state = ClusterState([uniform_node("a", 32_000, 128_000, 4, "A100", 40960)])
    d = decider(state, "dra-first-fit")
    first = d.decide(PodRequest("x", 0, 0, (GpuDemand(1, mode=Mode.EXCLUSIVE),)))
    assert first is not None and first.slices[0].gpu_position == 0
    state.reserve(first)
    two = d.decide(PodRequest("y", 0, 0, (GpuDemand(2, mode=Mode.EXCLUSIVE),)))
    assert two is not None and [s.gpu_position for s in two.slices] == [1, 2]


def test_prioritize_scores_scale_to_kube_schedulers_extender_range() -> None:
    assert extender_scores(np.array([1.0, 3.0, 2.0])).tolist() == [0, 10, 5]
    assert extender_scores(np.array([7.0, 7.0])).tolist() == [10, 10]
    assert extender_scores(np.array([2.0, 2.0, 1.0]), top_only=True).tolist() == [10, 9, 0]


def test_pods_without_gpus_go_the_default_schedulers_way_unless_the_policy_places_all(
        ) -> None:
    state = two_nodes()
    state.reserve(decider(state, "gpupool").decide(shared("seed", 50, cpu=16_000)) or
                  pytest.fail("no room"))
    cpu_pod = PodRequest("cpu", 8000, 1024)
    emptier = decider(state, "gpupool-exact").decide(cpu_pod)
    assert emptier is not None and state.cpu_free[state.index[emptier.node]] == 32_000


def test_at_weight_100_gpupools_score_outweighs_the_default_plugins() -> None:
    state = two_nodes()
    a = state.index["a"]
    state.reserve(decider(state, "gpupool").decide(shared("seed", 50, cpu=30_000)) or
                  pytest.fail("no room"))
    held = state.nodes[a].name if state.cpu_free[a] < 32_000 else state.nodes[1 - a].name
    alloc = decider(state, "gpupool-prioritize-w100").decide(shared("p", 30))
    assert alloc is not None and alloc.node == held  # best fit wins over an empty CPU


def test_an_unknown_variant_names_the_known_ones() -> None:
    with pytest.raises(UnknownName, match="dra-first-fit"):
        run_variant(synthetic_scenario(20), "first-fit", 42)


def test_the_gpupool_variant_is_the_simulators_own_protocol_run() -> None:
    scenario = synthetic_scenario(40)
    config = PolicyConfig(TargetWorkload.from_requests(scenario.requests))
    mine = run_variant(scenario, "gpupool", 42, policy="best-fit", config=config)
    theirs = run_protocol(scenario, "best-fit", 42, 1.3, config)
    assert mine.unallocated_gpu_pct == pytest.approx(theirs.unallocated_gpu_pct, abs=1e-4)
    assert mine.failed_before_full == theirs.failed_before_full


def test_on_the_synthetic_cluster_dra_first_fit_leaves_more_gpu_unallocated() -> None:
    """The default policy, three seeds of the protocol on 100 synthetic nodes (means)."""
    scenario = synthetic_scenario(100)
    runs = {v: [run_variant(scenario, v, s) for s in (42, 43, 44)]
            for v in ("dra-first-fit", "gpupool-prioritize", "gpupool")}
    mean = {v: sum(r.unallocated_gpu_pct for r in rs) / len(rs) for v, rs in runs.items()}
    assert mean["dra-first-fit"] > mean["gpupool-prioritize"] > mean["gpupool"]
    assert all(0 <= r.stranded_gpu_pct <= r.unallocated_gpu_pct + 1e-9
               for rs in runs.values() for r in rs)
