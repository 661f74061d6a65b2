"""The MIG study in the simulator: pods' profiles, fitted layouts, and what each regime
can and cannot serve on a tiny cluster."""

from __future__ import annotations

import pytest

from gpupool.core import mig
from gpupool.core.model import Node, uniform_node
from gpupool.core.request import GpuDemand, Mode, PodRequest, merged_demand
from gpupool.sim.mig import (
    BALANCED,
    GEOMETRY,
    Regime,
    fitted_layouts,
    mig_nodes,
    mig_request,
    run_regime,
)


def shared(key: str, core: int) -> PodRequest:
    return PodRequest(key, 1000, 1024, (GpuDemand(1, 0, core),))


def whole(key: str, count: int = 1) -> PodRequest:
    return PodRequest(key, 1000, 1024, (GpuDemand(count, mode=Mode.EXCLUSIVE),))


@pytest.mark.parametrize(("request_", "profile", "count"), [
    (shared("a", 10), "1g.10gb", 1), (shared("b", 15), "2g.20gb", 1),
    (shared("c", 40), "3g.40gb", 1), (shared("d", 50), "4g.40gb", 1),
    (shared("e", 60), "7g.80gb", 1), (whole("f", 2), "7g.80gb", 2),
])
def test_a_pod_takes_the_smallest_profile_covering_its_compute(
        request_: PodRequest, profile: str, count: int) -> None:
    d = merged_demand(mig_request(request_))
    assert (d.mig_profile, d.count, d.exclusive) == (profile, count, True)


def test_fitted_layouts_follow_the_mix_within_nvidias_rules() -> None:
    layouts_ = fitted_layouts({"7g.80gb": 2.0, "3g.40gb": 2.0, "1g.10gb": 2.0}, 4)
    devices = [[mig.device_at(GEOMETRY, "g", p, s) for p, s in lay] for lay in layouts_]
    assert all(mig.layout_problem(GEOMETRY, d) == "" for d in devices)
    made = sorted(p for lay in layouts_ for p, _ in lay)
    assert made.count("7g.80gb") in (1, 2) and made.count("3g.40gb") >= 2
    assert mig.layout_problem(GEOMETRY, [mig.device_at(GEOMETRY, "g", p, s)
                                         for p, s in BALANCED]) == ""


def nodes() -> list[Node]:
    raw = [uniform_node(f"n{i}", 96000, 393216, 2, "G2", 32768) for i in range(2)]
    raw.append(uniform_node("t", 96000, 393216, 2, "T4", 16384))
    return mig_nodes(raw, frozenset({"G2"}))


WORKLOAD = [whole("w1"), whole("w2"), shared("s1", 40), shared("s2", 40), shared("s3", 10),
            shared("s4", 20), PodRequest("cpu", 1000, 1024)]


def test_only_the_mig_capable_nodes_become_a100_stand_ins() -> None:
    got = nodes()
    assert [n.name for n in got] == ["n0", "n1"]
    assert {(g.model, g.memory_mib) for n in got for g in n.gpus} == {("A100-SXM4-80GB",
                                                                     81920)}


def test_static_balanced_layouts_serve_no_whole_gpu() -> None:
    run = run_regime(Regime.STATIC_BALANCED, nodes(), WORKLOAD, 42, inflate=1.0)
    assert run.arrived_pods > 0 and run.served_pods < run.arrived_pods
    assert run.repartitions == 0 and run.unallocated_pct > 0


def test_on_demand_makes_the_devices_the_arrivals_ask() -> None:
    run = run_regime(Regime.ON_DEMAND, nodes(), WORKLOAD, 42, inflate=1.0)
    assert run.repartitions > 0
    assert run.served_pods >= run_regime(Regime.STATIC_BALANCED, nodes(), WORKLOAD, 42,
                                         inflate=1.0).served_pods
    assert run.unallocated_pct <= 100.0 - run.demand_served_pct + 1e-9  # devices round up


def test_sharing_allocates_exactly_the_demand_it_serves() -> None:
    run = run_regime(Regime.SHARING, nodes(), WORKLOAD, 42, inflate=1.0)
    assert run.unallocated_pct == pytest.approx(100.0 - run.demand_served_pct)


def test_every_regime_is_the_same_for_the_same_seed() -> None:
    for regime in Regime:
        assert run_regime(regime, nodes(), WORKLOAD, 7, inflate=1.0).served_pods == \
            run_regime(regime, nodes(), WORKLOAD, 7, inflate=1.0).served_pods
