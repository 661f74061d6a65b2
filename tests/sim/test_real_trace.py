"""Threshold gates on the real Alibaba trace (read from ../shared, skipped when absent).

Bands: the issue's published figures for the default trace at 130 % inflation are
FGD 4.77 %, best-fit 7.14 %, random 13.70 % unallocated (mean of seeds 42-51), with
acceptance tolerances ±0.5, ±0.7 and ±1.5. Our 10-seed standard deviations are 0.11,
0.17 and 0.30, so the mean of the two gate seeds stays well inside the tolerance bands
themselves, which are the gates: FGD 4.27-5.27, best-fit 6.44-7.84, random 12.2-15.2.
On ``gpuspec20`` (18 % of pods bound to GPU models) the paper reports FGD 5.34 %;
our 10-seed FGD is 5.41 ± 0.22, so the two-seed gate is the same ±0.5 band. The
default policy must pack better than FGD there and on the default trace, where it
also stays under 4 % (10 seeds: 3.87 ± 0.05).
The full 10-seed table is ``bench/bench_simulator.py --acceptance``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.core.policies import DEFAULT_POLICY
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.workload import TargetWorkload
from gpupool.sim.campaign import Campaign, aggregate, run_campaign
from gpupool.sim.protocol import ProtocolRun, run_protocol
from gpupool.sim.scenario import Scenario
from gpupool.sim.sources import scenario_from_files
from gpupool.sim.timed import run_timed
from gpupool.sim.trace import read_nodes, read_pods
from tests.sim.paths import TRACE

pytestmark = [
    pytest.mark.trace,
    pytest.mark.skipif(not (TRACE / "openb_pod_list_default.csv").is_file(),
                       reason=f"Alibaba GPU trace not found at {TRACE} "
                              "(download cluster-trace-gpu-v2023/csv from alibaba/clusterdata)"),
]

NODES = "openb_node_list_gpu_node.csv"
GATE_SEEDS = (42, 43)


def trace(name: str) -> Path:
    return TRACE / name


@pytest.fixture(scope="module")
def default_trace() -> Scenario:
    return scenario_from_files(trace(NODES), trace("openb_pod_list_default.csv"))


@pytest.fixture(scope="module")
def gate_runs(default_trace: Scenario) -> dict[str, float]:
    campaign = Campaign(default_trace, ("fgd", DEFAULT_POLICY, "best-fit", "random"), GATE_SEEDS)
    stats = aggregate(run_campaign(campaign, workers=2))
    return {s.policy: float(s.mean_unallocated_gpu_pct or 0.0) for s in stats}


@pytest.fixture(scope="module")
def gpuspec_runs() -> dict[str, float]:
    scenario = scenario_from_files(trace(NODES), trace("openb_pod_list_gpuspec20.csv"))
    stats = aggregate(run_campaign(Campaign(scenario, ("fgd", DEFAULT_POLICY), GATE_SEEDS),
                                   workers=2))
    return {s.policy: float(s.mean_unallocated_gpu_pct or 0.0) for s in stats}


def test_reader_reproduces_the_published_cluster_and_demand_totals() -> None:
    nodes = read_nodes(trace(NODES))
    assert (len(nodes), sum(len(n.gpus) for n in nodes)) == (1213, 6212)
    assert sum(n.cpu_milli for n in nodes) == 107_018_000
    everything = read_nodes(trace("openb_node_list_all_node.csv"))
    assert (len(everything), sum(len(n.gpus) for n in everything)) == (1523, 6212)
    for name, pods, gpus in (("default", 8152, 6086.8), ("gpushare20", 8152, 6531.5),
                             ("multigpu20", 8324, 7086.8)):
        s = Scenario(name, tuple(nodes), tuple(read_pods(trace(f"openb_pod_list_{name}.csv"))))
        assert len(s.pods) == pods
        assert s.gpu_demand_milli == round(gpus * 1000)


@pytest.mark.slow  # the gate's campaign: seconds of simulation
def test_fgd_reproduces_the_published_figure_within_half_a_point(
        gate_runs: dict[str, float]) -> None:
    assert 4.77 - 0.5 <= gate_runs["fgd"] <= 4.77 + 0.5


@pytest.mark.slow
def test_best_fit_reproduces_the_published_figure_within_0_7_points(
        gate_runs: dict[str, float]) -> None:
    assert 7.14 - 0.7 <= gate_runs["best-fit"] <= 7.14 + 0.7


@pytest.mark.slow
def test_random_reproduces_the_published_figure_within_1_5_points(
        gate_runs: dict[str, float]) -> None:
    assert 13.70 - 1.5 <= gate_runs["random"] <= 13.70 + 1.5


@pytest.mark.slow
def test_fgd_packs_better_than_best_fit_and_best_fit_than_random(
        gate_runs: dict[str, float]) -> None:
    assert gate_runs["fgd"] < gate_runs["best-fit"] < gate_runs["random"]


@pytest.mark.slow
def test_our_own_policy_packs_better_than_fgd(gate_runs: dict[str, float]) -> None:
    assert gate_runs[DEFAULT_POLICY] < gate_runs["fgd"]
    assert gate_runs[DEFAULT_POLICY] <= 4.0


def test_a_fifth_of_the_gpuspec20_pods_name_the_gpu_models_they_accept() -> None:
    pods = read_pods(trace("openb_pod_list_gpuspec20.csv"))
    bound = [p.request for p in pods if p.request.models is not None]
    assert (len(pods), len(bound)) == (8152, 1444)
    assert all(r.gpus for r in bound)
    assert sum(1 for r in bound if r.models == frozenset({"T4"})) == 718


@pytest.mark.slow
def test_fgd_reproduces_the_published_gpuspec20_figure_within_half_a_point(
        gpuspec_runs: dict[str, float]) -> None:
    assert 5.34 - 0.5 <= gpuspec_runs["fgd"] <= 5.34 + 0.5


@pytest.mark.slow
def test_our_own_policy_packs_model_bound_pods_better_than_fgd(
        gpuspec_runs: dict[str, float]) -> None:
    assert gpuspec_runs[DEFAULT_POLICY] < gpuspec_runs["fgd"]


def test_literal_timestamps_barely_load_the_cluster(default_trace: Scenario) -> None:
    # FORMAT.md: at most about 56 pods (about 66 GPUs' worth) alive at once.
    config = PolicyConfig(workload=TargetWorkload.from_requests(default_trace.requests))
    run = run_timed(default_trace, "best-fit", 42, config)
    assert 45 <= run.peak_live_pods <= 65
    assert run.peak_allocation_pct < 2.0
    assert run.failed_pods == 0


def test_protocol_runs_are_deterministic_per_seed(default_trace: Scenario) -> None:
    config = PolicyConfig(workload=TargetWorkload.from_requests(default_trace.requests))
    first: ProtocolRun = run_protocol(default_trace, "random", 44, 1.3, config)
    again = run_protocol(default_trace, "random", 44, 1.3, config)
    assert first.unallocated_gpu_pct == again.unallocated_gpu_pct
    assert first.curve_allocated_pct == again.curve_allocated_pct
