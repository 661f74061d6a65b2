"""Learning the workload online (``--learn``): built-in first, then what arrived, on a clock."""

from __future__ import annotations

import pytest

from gpupool.core.errors import InvalidInput
from gpupool.core.model import uniform_node
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.policies.observed import BUILTIN_WORKLOAD, MIN_SAMPLES
from gpupool.core.request import GpuDemand, Mode, PodRequest
from gpupool.core.state import ClusterState
from gpupool.core.workload import TargetWorkload, TaskShape
from gpupool.sim.campaign import Campaign, run_campaign
from gpupool.sim.decision import Decider
from gpupool.sim.learning import REMEMBERED_REQUESTS, Learner
from gpupool.sim.protocol import ProtocolRun, run_protocol
from gpupool.sim.synthetic import synthetic_scenario
from gpupool.sim.timed import run_timed


def gpu_pod(k: int, cpu: int = 4000) -> PodRequest:
    return PodRequest(f"p{k}", cpu, 8192, (GpuDemand(1, mode=Mode.EXCLUSIVE),))


def empty(nodes: int = 4) -> ClusterState:
    return ClusterState([uniform_node(f"n{i}", 96_000, 1 << 19, 8, "T4", 16384)
                         for i in range(nodes)])


def test_the_learner_starts_built_in_and_refreshes_every_interval_of_the_clock() -> None:
    learner = Learner(every=100.0, weights={"fgd-balance.lambda": 0.5})
    assert learner.start() == PolicyConfig(BUILTIN_WORKLOAD, {"fgd-balance.lambda": 0.5})
    state = empty()
    refreshed = [k for k in range(350) if learner.arrived(gpu_pod(k), float(k), state)]
    assert refreshed == [100, 200, 300]  # the first arrival starts the clock at 0
    assert learner.refreshes == 3
    assert learner.note == "observed (301 GPU pods, 1 shapes)"


def test_a_refresh_before_fifty_gpu_pods_keeps_the_built_in_workload() -> None:
    learner = Learner(every=10.0, weights={})
    state = empty()
    configs = [learner.arrived(gpu_pod(k), float(k), state) for k in range(MIN_SAMPLES + 11)]
    learned = [c for c in configs if c is not None]
    assert learned[0].workload is BUILTIN_WORKLOAD  # at arrival 10: 11 pods seen
    assert learned[-1].workload == TargetWorkload((TaskShape(4000, 1, 1000),),
                                                  (MIN_SAMPLES + 11,), (8192,))


def test_the_learner_remembers_as_many_pods_as_the_extender() -> None:
    learner, state = Learner(every=1e9, weights={}), empty()
    for k in range(REMEMBERED_REQUESTS + 5):
        learner.arrived(gpu_pod(k), 0.0, state)
    assert len(learner.recent) == REMEMBERED_REQUESTS
    assert learner.recent[0].key == "p5"


def test_a_learning_interval_must_be_positive() -> None:
    with pytest.raises(InvalidInput, match="learning interval must be > 0"):
        Learner(every=0.0, weights={})
    with pytest.raises(InvalidInput, match="learning interval must be > 0"):
        Campaign(synthetic_scenario(10), ("fgd",), (1,), learn_every=-1.0)


def test_a_decider_that_learns_swaps_its_policy_when_a_refresh_is_due() -> None:
    state = empty(nodes=8)
    handed = PolicyConfig(TargetWorkload((TaskShape(1, 1, 1),), (1,)), {})
    decider = Decider(state, "fgd", handed, 1, learn_every=60.0)
    first = decider.placer
    assert first.policy.frag.workload is BUILTIN_WORKLOAD  # type: ignore[attr-defined]
    for k in range(61):
        allocation = decider.decide(gpu_pod(k), float(k))
        assert allocation is not None
        state.reserve(allocation)
    assert decider.placer is not first
    learned = decider.placer.policy.frag.workload  # type: ignore[attr-defined]
    assert learned.shapes == (TaskShape(4000, 1, 1000),)


def test_protocol_and_timed_runs_report_how_often_the_workload_was_learned() -> None:
    scenario = synthetic_scenario(30)
    config = Campaign(scenario, ("fgd-balance",), (1,)).config()
    run = run_protocol(scenario, "fgd-balance", 1, 1.3, config, learn_every=100.0)
    assert run.workload_refreshes == (run.pods - 1) // 100
    handed = run_protocol(scenario, "fgd-balance", 1, 1.3, config)
    assert handed.workload_refreshes == 0
    timed = run_timed(scenario, "fgd-balance", 1, config, learn_every=60.0)
    last = max(p.creation_s or 0.0 for p in scenario.pods)
    first = min(p.creation_s or 0.0 for p in scenario.pods)
    assert timed.workload_refreshes == pytest.approx((last - first) / 60.0, abs=1.0)


def test_a_campaign_that_learns_runs_in_worker_processes_too() -> None:
    campaign = Campaign(synthetic_scenario(30), ("fgd-balance",), (1, 2), learn_every=200.0)
    runs = run_campaign(campaign, workers=2)
    assert all(isinstance(r, ProtocolRun) and r.workload_refreshes > 0 for r in runs)
