"""Timed replay: pods come and go at their creation and deletion times."""

from __future__ import annotations

import numpy as np
import pytest

from gpupool.core.errors import InvalidInput
from gpupool.core.model import Node
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.request import PodRequest
from gpupool.core.workload import TargetWorkload
from gpupool.sim.scenario import Scenario, TracePod
from gpupool.sim.sources import scenario_from_files
from gpupool.sim.timed import ARRIVE, LEAVE, LEAVE_AT_ONCE, events, run_timed, time_mean
from tests.sim.paths import DATA


@pytest.mark.parametrize("policy", ["best-fit", "fgd", "random"])
def test_pods_take_turns_on_one_gpu(policy: str) -> None:
    # One GPU. a: 0-8 s whole GPU; b: 5-20 s whole GPU (a still holds it -> fails);
    # c: 10-30 s whole GPU (a left at 8 -> placed); d: from 12 s, 30 % core (c holds the
    # GPU exclusively -> fails). Allocation: 100 % on [0, 8), 0 on [8, 10), 100 % on
    # [10, 12] (last arrival) -> time-weighted mean (8 + 2) / 12 = 83.33 %.
    s = scenario_from_files(DATA / "timed_cluster.yaml", DATA / "timed_pods.yaml")
    run = run_timed(s, policy, 1, PolicyConfig(TargetWorkload.from_requests(s.requests)))
    assert run.failed_pods == 2
    assert run.failures_by_kind == {"cpu-only": 0, "gpu-share": 1, "one-gpu": 1, "multi-gpu": 0}
    assert run.peak_allocation_pct == pytest.approx(100.0)
    assert run.peak_live_pods == 1
    assert run.mean_allocation_pct == pytest.approx(100.0 * 10 / 12, abs=1e-4)
    assert run.curve_allocated_pct[-1] == pytest.approx(0.0)  # c left at 30 s


def test_departures_come_before_arrivals_at_the_same_time() -> None:
    pods = [TracePod(PodRequest("x"), 0.0, 10.0), TracePod(PodRequest("y"), 10.0, 10.0),
            TracePod(PodRequest("z"), 10.0, None)]
    assert events(pods) == [(0.0, ARRIVE, 0), (10.0, LEAVE, 0), (10.0, ARRIVE, 1),
                            (10.0, ARRIVE, 2), (10.0, LEAVE_AT_ONCE, 1)]


def test_timed_mode_needs_creation_times() -> None:
    s = scenario_from_files(DATA / "one_gpu_nodes.csv", DATA / "two_shares_pods.csv")
    with pytest.raises(InvalidInput, match="needs a creation time for every pod; share-a"):
        run_timed(s, "best-fit", 1, PolicyConfig())


def test_time_mean_weights_each_value_by_how_long_it_held() -> None:
    times = np.array([0.0, 2.0, 6.0, 10.0])
    pct = np.array([50.0, 100.0, 0.0, 80.0])
    assert time_mean(times, pct, until=6.0) == pytest.approx((2 * 50 + 4 * 100) / 6)
    assert time_mean(times, pct, until=10.0) == pytest.approx((100 + 400 + 0) / 10)


def test_a_scenario_without_gpus_is_refused() -> None:
    s = Scenario("x", (Node("cpu", 1000, 1024),), (TracePod(PodRequest("p"), 0.0, 1.0),))
    with pytest.raises(InvalidInput, match="no GPU"):
        run_timed(s, "best-fit", 1, PolicyConfig())
