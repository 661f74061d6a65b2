"""The FGD paper's protocol: shuffle, inflate, no departures, headline at arrived = 100 %."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from gpupool.core.errors import InvalidInput
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.state import ClusterState
from gpupool.core.workload import TargetWorkload
from gpupool.sim.campaign import Campaign, aggregate, run_campaign
from gpupool.sim.decision import Decider
from gpupool.sim.failure import FailureTally
from gpupool.sim.protocol import arrival_order, curve, run_protocol
from gpupool.sim.scenario import Scenario, demand_milli
from gpupool.sim.sources import scenario_from_files
from gpupool.sim.synthetic import synthetic_scenario
from tests.sim.paths import DATA


def golden(nodes: str, pods: str) -> Scenario:
    return scenario_from_files(DATA / nodes, DATA / pods)


def config(scenario: Scenario) -> PolicyConfig:
    return PolicyConfig(workload=TargetWorkload.from_requests(scenario.requests))


@pytest.mark.parametrize("policy", ["fgd", "best-fit", "random", "spread"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_two_sixty_percent_shares_on_one_gpu_leave_forty_percent(policy: str, seed: int) -> None:
    # 1 GPU; two pods of 0.6 GPU each (120 % of capacity, so no resampling at inflate 1.0).
    # Whatever the order: the first is placed (60 %), the second arrives at 120 % and
    # cannot fit -> headline read at the second pod: 100 - 60 = 40 % unallocated.
    s = golden("one_gpu_nodes.csv", "two_shares_pods.csv")
    run = run_protocol(s, policy, seed, 1.0, config(s))
    assert run.pods == 2
    assert run.unallocated_gpu_pct == pytest.approx(40.0)
    assert (run.failed_pods, run.failed_before_full) == (1, 1)
    assert run.failures_by_kind["gpu-share"] == 1
    assert run.failures_by_reason == {"gpu": 1, "cpu-memory": 0}


@pytest.mark.parametrize("seed", range(6))
def test_best_fit_packs_two_halves_and_a_whole_gpu_exactly(seed: int) -> None:
    # 2 GPUs; pods 0.5 + 0.5 + 1.0 = 100 % of capacity. Best-fit stacks the halves on one
    # GPU in any order, so the headline (read at the last pod) is 0 % unallocated.
    s = golden("two_gpu_nodes.csv", "halves_and_whole_pods.csv")
    run = run_protocol(s, "best-fit", seed, 1.0, config(s))
    assert run.pods == 3 and run.failed_pods == 0
    assert run.unallocated_gpu_pct == pytest.approx(0.0)
    assert run.curve_allocated_pct[-1] == pytest.approx(100.0)


def test_a_gpu_pod_that_finds_gpus_only_beside_too_little_cpu_fails_for_cpu() -> None:
    s = golden("cpu_strand_nodes.csv", "cpu_strand_pods.csv")
    state = ClusterState(s.nodes)
    tally = FailureTally(state)
    big = s.requests[0]  # 8 cores + 1 GPU: only "fat" (32 cores, 1 GPU) has the CPU
    assert tally.reason(big) == "cpu-memory"  # idle GPUs exist, on "lean" (4 cores)
    decider = Decider(state, "best-fit", config(s), seed=0)
    for request in s.requests:
        alloc = decider.decide(request)
        assert alloc is not None
        state.reserve(alloc)
        tally.changed()
    assert tally.reason(big) == "gpu"  # now no GPU is free anywhere


def test_inflation_appends_resampled_pods_until_the_target_and_no_further() -> None:
    s = synthetic_scenario(60)
    capacity = s.gpu_capacity_milli
    order = arrival_order(s.requests, capacity, 1.3, random.Random(7))
    trace = s.requests
    head, tail = order[: len(trace)], order[len(trace):]
    assert sorted(r.key for r in head) == sorted(r.key for r in trace)  # a shuffle of the trace
    assert [r.key for r in head] != [r.key for r in trace]
    demands = [demand_milli(r) for r in order]
    assert sum(demands) >= 1.3 * capacity > sum(demands[:-1])
    assert tail and all("~" in r.key for r in tail)
    assert len({r.key for r in order}) == len(order)  # resampled copies get their own keys
    originals = {r.key: r for r in trace}
    for copy in tail:
        source = originals[copy.key.split("~")[0]]
        assert copy.shape == source.shape


def test_the_same_seed_gives_the_same_order_and_another_seed_another() -> None:
    s = synthetic_scenario(40)
    first = [r.key for r in arrival_order(s.requests, s.gpu_capacity_milli, 1.3, random.Random(5))]
    again = [r.key for r in arrival_order(s.requests, s.gpu_capacity_milli, 1.3, random.Random(5))]
    other = [r.key for r in arrival_order(s.requests, s.gpu_capacity_milli, 1.3, random.Random(6))]
    assert first == again and first != other


def test_headline_is_read_at_the_first_pod_whose_arrived_demand_reaches_capacity() -> None:
    s = synthetic_scenario(40)
    run = run_protocol(s, "best-fit", 3, 1.3, config(s))
    xs, ys = np.asarray(run.curve_arrived_pct), np.asarray(run.curve_allocated_pct)
    at_full = ys[np.searchsorted(xs, 100.0)]
    assert xs[np.searchsorted(xs, 100.0)] == pytest.approx(100.0)
    assert run.unallocated_gpu_pct == pytest.approx(100.0 - at_full, abs=1e-3)
    assert xs[-1] >= 129.5  # inflated to 130 %
    assert np.all(np.diff(ys) >= 0)  # no departures: allocation never drops
    # at the first pod reaching step x, arrived < x + that pod's demand; allocated <= arrived
    biggest = max(demand_milli(r) for r in s.requests) * 100.0 / s.gpu_capacity_milli
    assert np.all(ys <= xs + biggest + 1e-6)
    assert run.failed_before_full <= run.failed_pods


def test_curve_steps_take_the_first_pod_reaching_each_step() -> None:
    arrived = np.array([10.0, 40.0, 50.0, 100.0, 130.0])
    allocated = np.array([10.0, 40.0, 45.0, 80.0, 85.0])
    xs, ys = curve(arrived, allocated, step=50.0)
    assert xs == (0.0, 50.0, 100.0)
    assert ys == (10.0, 45.0, 80.0)


def test_inflate_below_one_or_a_workload_without_gpus_is_refused() -> None:
    s = synthetic_scenario(20)
    with pytest.raises(InvalidInput, match=r"inflate must be >= 1\.0"):
        arrival_order(s.requests, s.gpu_capacity_milli, 0.9, random.Random(1))
    cpu_only = [r for r in s.requests if not r.gpus]
    with pytest.raises(InvalidInput, match="asks for no GPU"):
        arrival_order(cpu_only, s.gpu_capacity_milli, 1.3, random.Random(1))


def test_fgd_type_policies_get_the_target_workload_of_the_uninflated_trace() -> None:
    s = synthetic_scenario(40)
    campaign = Campaign(s, ("fgd",), (1,))
    workload = campaign.config().workload
    assert workload == TargetWorkload.from_requests(s.requests)
    assert workload is not None and workload.total_weight <= len(s.pods)


def test_a_process_pool_gives_the_same_runs_as_one_process() -> None:
    s = synthetic_scenario(30)
    campaign = Campaign(s, ("fgd", "random"), (1, 2))
    alone = run_campaign(campaign, workers=1)
    pooled = run_campaign(campaign, workers=2)
    key = [(r.policy, r.seed, r.unallocated_gpu_pct, r.failed_pods) for r in alone]
    assert key == [(r.policy, r.seed, r.unallocated_gpu_pct, r.failed_pods) for r in pooled]
    assert [(r.policy, r.seed) for r in alone] == [("fgd", 1), ("fgd", 2), ("random", 1),
                                                    ("random", 2)]


def test_aggregate_reports_mean_and_sample_std_per_policy() -> None:
    s = golden("one_gpu_nodes.csv", "two_shares_pods.csv")
    runs = run_campaign(Campaign(s, ("best-fit",), (1, 2, 3), inflate=1.0))
    (stats,) = aggregate(runs)
    assert stats.runs == 3
    assert stats.mean_unallocated_gpu_pct == pytest.approx(40.0)
    assert stats.std_unallocated_gpu_pct == pytest.approx(0.0)


def test_progress_is_told_every_pod_once() -> None:
    s = synthetic_scenario(40)
    seen: Counter[str] = Counter()
    run = run_protocol(s, "random", 1, 1.3, config(s), lambda n: seen.update({"pods": n}))
    assert seen["pods"] == run.pods
