"""Remote slices in the core: the tiers (own node, topology domain, any), one account per
GPU across local and remote slices, and reasons a person can act on."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.core.allocation import Allocation
from gpupool.core.eligibility import Catalogue, charge_of, constraints_for
from gpupool.core.errors import InvalidInput, OverCommit
from gpupool.core.fit import Constraints
from gpupool.core.placement import Placer
from gpupool.core.policies import make_policy
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.quota import Limit
from gpupool.core.reasons import Check
from gpupool.core.request import Serving
from gpupool.core.serving import ServingConfig, ServingPlacer, Tier
from gpupool.core.state import ClusterState
from tests.core.builders import GIB, cluster, hold, node, pod, shared, whole

ZONE, RACK = "topology.kubernetes.io/zone", "example.com/rack"
ON = ServingConfig(remote=True)


def placer(config: ServingConfig = ON, policy: str = "best-fit") -> ServingPlacer:
    return ServingPlacer(Placer(make_policy(policy, PolicyConfig())), config)


def zoned(name: str, zone: str, gpus: int = 2, rack: str | None = None, cpu: int = 32000
          ) -> object:
    labels = {ZONE: zone} | ({RACK: rack} if rack else {})
    return node(name, gpus=gpus, labels=labels, cpu=cpu)


def slice_pod(key: str = "p", gib: int = 8, serving: Serving = Serving.REMOTE_ALLOWED,
              cpu: int = 1000):
    return replace(pod(key, shared(1, gib * GIB), cpu=cpu), serving=serving)


def fill(state: ClusterState, name: str) -> None:
    """Every GPU of ``name`` held whole."""
    n = state.nodes[state.node_index(name)]
    for p, g in enumerate(n.gpus):
        hold(state, f"fill-{name}-{p}", name, (p, g.memory_mib, 100))


def decide(state: ClusterState, request, home: str, sp: ServingPlacer | None = None):
    return (sp or placer()).decide(state, request, home, random.Random(0))


# -- the tiers -------------------------------------------------------------------------------
def test_a_pod_whose_node_has_room_keeps_its_slice_local() -> None:
    state = cluster(zoned("home", "a"), zoned("n1", "a"))
    served = decide(state, slice_pod(), "home")
    assert served.tier == Tier(0)
    assert served.allocation is not None and not served.allocation.remote
    assert served.allocation.node == "home"


def test_a_remote_required_pod_on_a_node_with_room_gets_a_slice_server_beside_it() -> None:
    state = cluster(zoned("home", "a"), zoned("n1", "a"))
    served = decide(state, slice_pod(serving=Serving.REMOTE_REQUIRED), "home")
    assert served.tier == Tier(0)
    assert served.allocation is not None and served.allocation.served_by == "home"
    assert "slice server on its own node" in served.summary()


def test_a_full_node_gets_its_slice_from_its_own_zone_before_any_other() -> None:
    state = cluster(zoned("home", "a"), zoned("far", "b"), zoned("near", "a"))
    fill(state, "home")
    served = decide(state, slice_pod(), "home")
    assert served.allocation is not None
    assert (served.allocation.node, served.allocation.served_by) == ("home", "near")
    assert served.tier == Tier(1, ZONE, "a")


def test_a_full_zone_sends_the_slice_to_any_node_and_says_why() -> None:
    state = cluster(zoned("home", "a"), zoned("near", "a"), zoned("far", "b"))
    fill(state, "home")
    fill(state, "near")
    served = decide(state, slice_pod(), "home")
    assert served.allocation is not None and served.allocation.served_by == "far"
    assert served.tier == Tier(2)
    text = served.summary()
    assert f"{ZONE}=a: none of its 1 other node with GPUs has room for 1 × (8192 MiB)" in text
    assert text.endswith("served from far (any node)")


def test_domains_are_tried_most_specific_first() -> None:
    config = ServingConfig(remote=True, domains=(RACK, ZONE))
    state = cluster(zoned("home", "a", rack="r1"), zoned("zone-mate", "a", rack="r2"),
                    zoned("rack-mate", "a", rack="r1"), zoned("far", "b", rack="r9"))
    fill(state, "home")
    served = decide(state, slice_pod(), "home", placer(config))
    assert served.allocation is not None and served.allocation.served_by == "rack-mate"
    fill(state, "rack-mate")
    served = decide(state, slice_pod(), "home", placer(config))
    assert served.allocation is not None and served.allocation.served_by == "zone-mate"
    assert [t.describe() for t, _ in served.misses] == ["own node", f"{RACK}=r1"]


def test_a_home_without_the_domain_label_skips_that_tier() -> None:
    state = cluster(node("home", gpus=0), zoned("n1", "a"))
    served = decide(state, slice_pod(), "home")
    assert served.allocation is not None and served.allocation.served_by == "n1"
    assert served.tier == Tier(2)
    assert [t.rank for t, _ in served.misses] == [0]


def test_a_pod_on_a_node_without_gpus_gets_a_remote_slice() -> None:
    state = cluster(node("cpu-only", gpus=0, labels={ZONE: "a"}), zoned("gpu", "a"))
    served = decide(state, slice_pod(cpu=4000), "cpu-only")
    alloc = served.allocation
    assert alloc is not None and (alloc.node, alloc.served_by) == ("cpu-only", "gpu")
    state.reserve(alloc)
    i, k = state.index["cpu-only"], state.index["gpu"]
    assert state.cpu_free[i] == state.cpu_cap[i] - 4000  # the pod's CPU on its own node
    assert state.cpu_free[k] == state.cpu_cap[k]  # the serving node gives GPU only
    assert int(state.unit_free[k].sum()) == int(state.unit_cap[k].sum()) - 8 * GIB // 256


def test_within_a_tier_the_packing_policy_chooses() -> None:
    state = cluster(node("home", gpus=0), node("roomy", gpus=1), node("tight", gpus=1))
    hold(state, "half", "tight", (0, 24 * GIB, 50))
    best_fit = decide(state, slice_pod(), "home", placer(policy="best-fit"))
    spread = decide(state, slice_pod(), "home", placer(policy="spread"))
    assert best_fit.allocation is not None and best_fit.allocation.served_by == "tight"
    assert spread.allocation is not None and spread.allocation.served_by == "roomy"


def test_a_local_pod_is_never_served_remotely() -> None:
    state = cluster(zoned("home", "a"), zoned("n1", "a"))
    fill(state, "home")
    served = decide(state, slice_pod(serving=Serving.LOCAL), "home")
    assert served.allocation is None
    assert [t.rank for t, _ in served.misses] == [0]


def test_whole_gpus_can_be_served_remotely_too() -> None:
    state = cluster(node("home", gpus=0), node("n1", gpus=4))
    request = replace(pod("p", whole(2)), serving=Serving.REMOTE_ALLOWED)
    alloc = decide(state, request, "home").allocation
    assert alloc is not None and alloc.exclusive and len(alloc.gpu_uuids) == 2
    state.reserve(alloc)
    assert int(state.free_milli[state.index["n1"]][:4].clip(0).sum()) == 2000


# -- refusals and reasons --------------------------------------------------------------------
def test_a_home_without_cpu_for_the_pod_is_refused_with_its_numbers() -> None:
    state = cluster(node("home", gpus=0, cpu=2000), zoned("n1", "a"))
    served = decide(state, slice_pod(cpu=4000), "home")
    assert served.allocation is None and served.refusal is not None
    assert served.refusal.check is Check.CPU
    assert "4000m CPU needed" in served.summary()


def test_remote_required_without_a_provider_is_refused_and_says_so() -> None:
    state = cluster(zoned("home", "a"))
    served = decide(state, slice_pod(serving=Serving.REMOTE_REQUIRED), "home",
                    placer(ServingConfig(remote=False)))
    assert served.refusal is not None and served.refusal.check is Check.REMOTE
    assert served.refusal.permanent
    assert "not enabled" in served.summary()


def test_remote_allowed_without_a_provider_is_placed_locally_or_says_why_not() -> None:
    off = placer(ServingConfig(remote=False))
    state = cluster(zoned("home", "a"), zoned("n1", "a"))
    assert decide(state, slice_pod(), "home", off).allocation == \
        decide(state, slice_pod(serving=Serving.LOCAL), "home", off).allocation
    fill(state, "home")
    served = decide(state, slice_pod(), "home", off)
    assert served.allocation is None and "not enabled" in served.summary()


def test_no_room_anywhere_lists_every_tier() -> None:
    state = cluster(zoned("home", "a"), zoned("n1", "b"))
    fill(state, "home")
    fill(state, "n1")
    served = decide(state, slice_pod(), "home")
    assert served.allocation is None
    assert [t.describe() for t, _ in served.misses] == ["own node", f"{ZONE}=a", "any node"]
    assert f"{ZONE}=a: no other node with GPUs" in served.summary()


def test_a_quota_refusal_refuses_every_tier() -> None:
    state = cluster(zoned("home", "a"), zoned("n1", "a"))
    catalogue = Catalogue()
    catalogue.quotas.set_tenant_limit("t", Limit(gpus=1))
    sp, rng = placer(), random.Random(0)
    first = replace(slice_pod("one"), tenant="t")
    fill(state, "home")
    c = constraints_for(state, first, catalogue)
    served = sp.decide(state, first, "home", rng, c)
    assert served.allocation is not None and served.allocation.served_by == "n1"
    state.reserve(served.allocation)
    catalogue.quotas.charge("one", charge_of(first, served.allocation, c))  # counted as local
    assert catalogue.quotas.used_by_tenant("t").gpus == 1
    second = replace(slice_pod("two"), tenant="t")
    c2 = constraints_for(state, second, catalogue)
    refused = sp.decide(state, second, "home", rng, c2)
    assert refused.refusal is not None and refused.refusal.check is Check.QUOTA
    assert not sp.homes(state, second, c2).fits.any()


def test_a_class_mask_limits_where_the_slice_may_be_served() -> None:
    state = cluster(node("home", gpus=0), node("t4", gpus=2, model="T4"),
                    node("a100", gpus=2, model="A100"))
    only_a100 = np.zeros(state.present.shape, np.bool_)
    only_a100[state.index["a100"], :2] = True
    served = placer().decide(state, slice_pod(), "home", random.Random(0),
                             Constraints(gpu_mask=only_a100))
    assert served.allocation is not None and served.allocation.served_by == "a100"


def test_a_model_list_applies_to_the_serving_gpu_not_the_home() -> None:
    state = cluster(node("home", gpus=2, model="T4"), node("v100", gpus=2, model="V100"))
    request = replace(slice_pod(), models=frozenset({"V100"}))
    served = decide(state, request, "home")
    assert served.allocation is not None and served.allocation.served_by == "v100"


def test_config_refuses_empty_and_repeated_domain_labels() -> None:
    with pytest.raises(InvalidInput, match="empty"):
        ServingConfig(domains=("",))
    with pytest.raises(InvalidInput, match=f"{ZONE} is listed twice"):
        ServingConfig(domains=(ZONE, ZONE))


# -- one account per GPU ---------------------------------------------------------------------
def test_a_local_and_a_remote_slice_never_over_commit_one_gpu() -> None:
    state = cluster(node("home", gpus=0), node("gpu", gpus=1))
    remote = decide(state, slice_pod("remote", gib=30), "home").allocation
    assert remote is not None
    state.reserve(remote)
    local = Allocation("local", "gpu", 0, 0, (replace(remote.slices[0], memory_mib=16 * GIB),))
    with pytest.raises(OverCommit, match="GPU-gpu-0"):
        state.reserve(local)
    assert decide(state, slice_pod("more", gib=16), "home").allocation is None


def test_releasing_a_remote_slice_frees_both_nodes() -> None:
    state = cluster(node("home", gpus=0), node("gpu", gpus=1))
    before = (state.cpu_free.copy(), state.unit_free.copy(), state.core_free.copy())
    alloc = decide(state, slice_pod(), "home").allocation
    assert alloc is not None
    state.reserve(alloc)
    assert {a.key for a in state.allocations_on("home")} == {"p"}
    assert {a.key for a in state.allocations_on("gpu")} == {"p"}
    copy = state.snapshot().state()
    assert {a.key for a in copy.allocations_on("gpu")} == {"p"}
    state.release("p")
    after = (state.cpu_free, state.unit_free, state.core_free)
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))
    assert not list(state.allocations_on("gpu"))


def test_removing_the_serving_node_releases_the_pods_cpu_on_its_home() -> None:
    state = cluster(node("home", gpus=0), node("gpu", gpus=1))
    alloc = decide(state, slice_pod(cpu=3000), "home").allocation
    assert alloc is not None
    state.reserve(alloc)
    assert state.remove_node("gpu") == [alloc]
    assert state.cpu_free[state.index["home"]] == state.cpu_cap[state.index["home"]]
    assert not list(state.allocations_on("home"))


def test_replacing_the_home_keeps_the_remote_slice_where_it_is() -> None:
    state = cluster(node("home", gpus=0), node("gpu", gpus=2))
    alloc = decide(state, slice_pod(), "home").allocation
    assert alloc is not None
    state.reserve(alloc)
    assert state.replace_node(node("home", gpus=0, cpu=64000)) == []
    assert state.allocations["p"] == alloc
    assert state.replace_node(node("gpu", gpus=2, gpu_gib=80)) == []  # slices re-seated
    assert state.allocations["p"] == alloc


def test_part_on_splits_a_remote_allocation_by_node() -> None:
    state = cluster(node("home", gpus=0), node("gpu", gpus=1))
    alloc = decide(state, slice_pod(cpu=3000), "home").allocation
    assert alloc is not None
    assert alloc.part_on("home") == Allocation("p", "home", 3000, 1024)
    assert alloc.part_on("gpu") == Allocation("p", "gpu", 0, 0, alloc.slices)
    assert alloc.part_on("elsewhere") == Allocation("p", "elsewhere", 0, 0)
    local = replace(alloc, served_by="")
    assert local.part_on("home") is local


# -- every home at once: filter and prioritize -----------------------------------------------
def test_homes_rank_each_node_by_the_tier_it_would_get() -> None:
    state = cluster(zoned("fits", "a"), zoned("full", "a"), node("cpu-only", gpus=0),
                    zoned("lonely", "b", gpus=0), node("tiny", gpus=0, cpu=500))
    fill(state, "full")
    sp = placer()
    homes = sp.homes(state, slice_pod())
    assert homes.rank.tolist() == [0, 1, 2, 2, -1]
    reason = sp.explain_home(state, slice_pod(), state.index["tiny"], homes=homes)
    assert reason is not None and reason.check is Check.CPU
    assert sp.explain_home(state, slice_pod(), state.index["lonely"]) is None


def test_a_local_pod_may_only_run_where_its_slice_fits() -> None:
    state = cluster(zoned("fits", "a"), node("cpu-only", gpus=0))
    request = slice_pod(serving=Serving.LOCAL)
    sp = placer()
    assert sp.homes(state, request).rank.tolist() == [0, -1]
    reason = sp.explain_home(state, request, 1)
    assert reason is not None and reason.check is Check.GPU_COUNT


def test_no_room_anywhere_explains_a_home_with_the_remote_check() -> None:
    state = cluster(node("home", gpus=0), node("gpu", gpus=1))
    fill(state, "gpu")
    reason = placer().explain_home(state, slice_pod(), 0)
    assert reason is not None and reason.check is Check.REMOTE
    assert "any other node" in reason.message


SLICES = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 1), st.integers(1, 40),
                            st.sampled_from(list(Serving)), st.integers(0, 40000)),
                  min_size=1, max_size=40)


def small_cluster() -> ClusterState:
    return cluster(zoned("a0", "a", gpus=1, rack="r1"), zoned("a1", "a", gpus=2, rack="r1"),
                   zoned("b0", "b", gpus=1, rack="r3"), node("c0", gpus=0, cpu=16000),
                   zoned("a2", "a", gpus=0, rack="r1", cpu=8000), zoned("b1", "b", gpus=2),
                   zoned("a3", "a", gpus=1, rack="r2"))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SLICES, st.booleans())
def test_random_local_and_remote_placements_never_over_commit_and_respect_tiers(
        pods: list[tuple[int, int, int, Serving, int]], racks: bool) -> None:
    state = small_cluster()
    config = ServingConfig(remote=True, domains=(RACK, ZONE) if racks else (ZONE,))
    sp, rng = placer(config), random.Random(1)
    for k, (home_row, exclusive, gib, serving, cpu) in enumerate(pods):
        home = state.nodes[home_row].name
        demand = whole(1) if exclusive else shared(1, gib * GIB)
        request = replace(pod(f"p{k}", demand, cpu=cpu), serving=serving)
        ranks = sp.homes(state, request).rank
        served = sp.decide(state, request, home, rng)
        # filter and bind agree: a home is kept exactly when bind finds a tier there
        assert (ranks[home_row] >= 0) == served.ok
        if served.allocation is None:
            continue
        assert served.tier is not None and served.tier.rank == ranks[home_row]
        assert_tier_respected(state, sp, request, home, served.allocation.gpu_node,
                              served.tier.rank)
        state.reserve(served.allocation)
    assert (state.unit_free[state.present] >= 0).all()
    assert (state.core_free[state.present] >= 0).all()
    assert (state.cpu_free >= 0).all() and (state.mem_free >= 0).all()


def assert_tier_respected(state: ClusterState, sp: ServingPlacer, request, home: str,
                          server: str, rank: int) -> None:
    """No node of a better tier could have served the slice."""
    if rank == 0:
        assert server == home
        return
    assert server != home
    better = [name for name in (n.name for n in state.nodes)
              if name not in (home, server) and shares_tier(state, sp, home, name) < rank]
    for name in better:
        probe = replace(request, serving=Serving.REMOTE_ALLOWED, cpu_milli=0, memory_mib=0)
        assert sp.placer.decide(state, probe, random.Random(0), among=np.array(
            [state.index[name]])).allocation is None, f"{name} was in a better tier"


def shares_tier(state: ClusterState, sp: ServingPlacer, home: str, other: str) -> int:
    """The tier ``other`` is in, seen from ``home``."""
    mine = dict(state.nodes[state.index[home]].labels)
    theirs = dict(state.nodes[state.index[other]].labels)
    for r, label in enumerate(sp.config.domains, start=1):
        if label in mine and mine[label] == theirs.get(label):
            return r
    return len(sp.config.domains) + 1
