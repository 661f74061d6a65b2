"""kube-scheduler's node window in the simulator (``--nodes-to-score``)."""

from __future__ import annotations

import numpy as np
import pytest

from gpupool.core.errors import InvalidInput
from gpupool.core.policies.config import PolicyConfig
from gpupool.sim.campaign import Campaign, aggregate, run_campaign
from gpupool.sim.decision import Decider
from gpupool.sim.synthetic import synthetic_scenario
from gpupool.sim.window import NodeWindow, nodes_to_find
from tests.core.builders import cluster, hold_whole, node, pod, whole


@pytest.mark.parametrize(("nodes", "percentage", "expected"), [
    (50, 0, 50),          # below 100 nodes kube-scheduler looks at every node
    (100, 0, 100),        # 50 % of 100 is 50, but never fewer than 100
    (1000, 0, 420),       # adaptive: 50 - 1000/125 = 42 %
    (1213, 0, 497),       # the Alibaba cluster: 50 - 9 = 41 %
    (5000, 0, 500),       # 50 - 40 = 10 %
    (20000, 0, 1000),     # 50 - 160 < 5: the 5 % floor
    (1000, 30, 300),      # a share set in the scheduler's configuration
    (1000, 1, 100),       # 1 % of 1,000 is 10: the 100-node floor
    (1000, 100, 1000),
])
def test_the_window_has_kube_schedulers_size(nodes: int, percentage: int, expected: int
                                              ) -> None:
    assert nodes_to_find(nodes, percentage) == expected


@pytest.mark.parametrize("percentage", [-1, 101])
def test_a_share_outside_0_to_100_is_refused(percentage: int) -> None:
    with pytest.raises(InvalidInput, match="percentageOfNodesToScore"):
        nodes_to_find(1000, percentage)


def test_a_pod_is_offered_every_node_once_starting_where_the_last_search_stopped() -> None:
    window = NodeWindow(1000, 0)  # 420 nodes a window
    first = list(window.rounds())
    assert [len(w) for w in first] == [420, 420, 420]
    assert first[0][0] == 0 and first[1][0] == 420 and first[2][0] == 840
    assert set(np.concatenate(first).tolist()) == set(range(1000))  # wraps around
    assert window.start == 260
    following = next(window.rounds())  # the next pod, placed in its first window
    assert following[0] == 260 and window.start == 680


def test_a_pod_whose_first_window_is_full_bounces_to_the_next() -> None:
    # 200 one-GPU nodes, all held but the one at row 150: the first window (rows 0-99)
    # has no room, the second holds the free GPU.
    state = cluster(*(node(f"n{k:03}", gpus=1) for k in range(200)))
    for k in range(200):
        if k != 150:
            hold_whole(state, f"held-{k}", f"n{k:03}", 0)
    decider = Decider(state, "best-fit", PolicyConfig(), seed=1, nodes_to_score=0)
    assert decider.window.size == 100
    allocation = decider.decide(pod("p", whole()))
    assert allocation is not None and allocation.node == "n150"
    assert decider.bounced == 1
    state.reserve(allocation)
    assert decider.decide(pod("q", whole())) is None  # no room in any window: fails
    assert decider.bounced == 1


def test_every_node_offered_gives_the_runs_of_no_window() -> None:
    scenario = synthetic_scenario(120)
    plain = run_campaign(Campaign(scenario, ("fgd-balance",), (1, 2)))
    whole_window = run_campaign(Campaign(scenario, ("fgd-balance",), (1, 2),
                                         nodes_to_score=100))
    for a, b in zip(plain, whole_window, strict=True):
        assert a.unallocated_gpu_pct == b.unallocated_gpu_pct
        assert a.failed_pods == b.failed_pods
        assert a.bounced_pods == b.bounced_pods == 0


def test_a_narrow_window_bounces_pods_and_the_runs_say_how_many() -> None:
    scenario = synthetic_scenario(600)
    runs = run_campaign(Campaign(scenario, ("best-fit",), (1,), nodes_to_score=5))
    assert runs[0].nodes_to_score == 5
    assert runs[0].bounced_pods > 0  # near full, some 100-node windows have no room
    assert aggregate(runs)[0].mean_bounced_pods == runs[0].bounced_pods


def test_a_campaign_refuses_a_share_outside_0_to_100() -> None:
    with pytest.raises(InvalidInput, match="percentageOfNodesToScore"):
        Campaign(synthetic_scenario(10), ("best-fit",), (1,), nodes_to_score=150)
