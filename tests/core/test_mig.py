"""MIG in the core: the profile catalogue, layouts, and MIG devices as schedulable units."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gpupool.core import mig
from gpupool.core.allocation import Allocation, Slice
from gpupool.core.classes import ClassCatalog, ResourceClass
from gpupool.core.eligibility import request_amount
from gpupool.core.errors import InvalidInput, OverCommit, UnknownName
from gpupool.core.fit import explain, feasible
from gpupool.core.groups import GroupCatalog, ResourceGroup
from gpupool.core.mig import MigDevice
from gpupool.core.model import Node, uniform_node
from gpupool.core.placement import Placer
from gpupool.core.policies import make_policy
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.reasons import Check
from gpupool.core.repartition import partitioned
from gpupool.core.request import GpuDemand, Mode, PodRequest
from gpupool.core.selector import Selector
from gpupool.core.state import ClusterState

from .builders import pod, shared, whole

A100 = mig.by_name("A100-80GB")
GIB = 1024


def device(profile: str, start: int, parent: str = "GPU-n-0",
           geometry: mig.MigGeometry = A100) -> MigDevice:
    return mig.device_at(geometry, parent, profile, start)


def mig_node(name: str = "n", layout: dict[int, list[tuple[str, int]]] | None = None,
             gpus: int = 2, model: str = "A100-SXM4-80GB", gib: int = 80,
             labels: dict[str, str] | None = None) -> Node:
    """``gpus`` GPUs; those named in ``layout`` (index -> [(profile, start)]) in MIG mode."""
    base = uniform_node(name, 32000, 256 * GIB, gpus, model, gib * GIB, labels)
    geometry = mig.geometry_of(model, gib * GIB)
    assert geometry is not None
    return partitioned(base, {
        f"GPU-{name}-{i}": [device(p, s, f"GPU-{name}-{i}", geometry) for p, s in devices]
        for i, devices in (layout or {}).items()})


def asks(profile: str, count: int = 1, key: str = "p", cpu: int = 1000) -> PodRequest:
    return PodRequest(key, cpu, 1024, (GpuDemand(count, mode=Mode.EXCLUSIVE,
                                                 mig_profile=profile),))


# -- the catalogue ----------------------------------------------------------------------------
@pytest.mark.parametrize(("geometry", "names"), [
    ("A100-40GB", ["1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]),
    ("A100-80GB", ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
    ("H100-80GB", ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
    ("H200-141GB", ["1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]),
])
def test_each_gpu_offers_nvidias_profiles_with_the_instances_available(
        geometry: str, names: list[str]) -> None:
    g = mig.by_name(geometry)
    assert [p.name for p in g.profiles] == names
    assert [p.count for p in g.profiles] == [7, 4, 3, 2, 1, 1]
    assert [p.slices for p in g.profiles] == [1, 1, 2, 3, 4, 7]
    assert [p.size for p in g.profiles] == [1, 2, 2, 4, 4, 8]  # memory fraction in eighths


@pytest.mark.parametrize(("model", "gib", "geometry"), [
    ("A100-SXM4-40GB", 40, "A100-40GB"), ("A100-PCIE-40GB", 40, "A100-40GB"),
    ("A100-SXM4-80GB", 80, "A100-80GB"), ("H100-80GB-HBM3", 80, "H100-80GB"),
    ("H200", 141, "H200-141GB"), ("H100-NVL", 94, None), ("T4", 16, None), ("V100M32", 32, None),
])
def test_the_geometry_comes_from_the_model_and_memory(model: str, gib: int,
                                                      geometry: str | None) -> None:
    found = mig.geometry_of(model, gib * GIB)
    assert (found.name if found else None) == geometry


@pytest.mark.parametrize("layout", [
    [("4g.40gb", 0), ("3g.40gb", 4)],
    [("3g.40gb", 0), ("3g.40gb", 4)],
    [("1g.10gb", s) for s in range(7)],
    [("2g.20gb", 0), ("2g.20gb", 2), ("2g.20gb", 4), ("1g.10gb", 6)],
    [("2g.20gb", 0), ("2g.20gb", 2), ("2g.20gb", 4), ("1g.20gb", 6)],
    [("4g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)],
    [("7g.80gb", 0)],
    [],
], ids=["4g+3g", "3g+3g", "7x1g", "3x2g+1g", "3x2g+1g.20gb", "4g+2g+1g", "7g", "empty"])
def test_layouts_nvidia_allows_are_valid(layout: list[tuple[str, int]]) -> None:
    assert mig.layout_problem(A100, [device(p, s) for p, s in layout]) == ""


@pytest.mark.parametrize(("layout", "problem"), [
    ([("3g.40gb", 0), ("4g.40gb", 0)], "3g.40gb@0 share memory slice 0"),
    ([("7g.80gb", 0), ("1g.10gb", 6)], "share memory slice 6"),
    ([("1g.20gb", 0), ("1g.10gb", 1)], "share memory slice 1"),
])
def test_layouts_that_overlap_are_refused_with_the_slice(layout: list[tuple[str, int]],
                                                         problem: str) -> None:
    assert problem in mig.layout_problem(A100, [device(p, s) for p, s in layout])


def test_a_profile_cannot_start_where_nvidia_does_not_place_it() -> None:
    with pytest.raises(InvalidInput, match=r"3g.40gb cannot start at memory slice 2 .* 0, 4"):
        device("3g.40gb", 2)
    with pytest.raises(UnknownName, match=r"no MIG profile 1g.5gb"):
        device("1g.5gb", 0)
    bad = MigDevice("GPU-n-0", "2g.20gb", 1, 2, 2)
    assert "cannot be placed at 1:2" in mig.layout_problem(A100, [bad])


def test_free_starts_are_the_placements_left() -> None:
    devices = [device("4g.40gb", 0), device("1g.10gb", 4)]
    assert mig.free_starts(A100, devices, "1g.10gb") == [5, 6]
    assert mig.free_starts(A100, devices, "2g.20gb") == []
    assert mig.free_starts(A100, devices, "1g.20gb") == [6]
    assert mig.free_starts(A100, [device("7g.80gb", 0)], "1g.10gb") == []


def test_a_layout_reads_back_as_written() -> None:
    devices = (device("1g.10gb", 0), device("2g.20gb", 2), device("3g.40gb", 4))
    text = mig.describe_layout(devices)
    assert text == "1g.10gb@0,2g.20gb@2,3g.40gb@4"
    assert mig.read_layout(A100, "GPU-n-0", text, "here") == devices
    assert mig.read_layout(A100, "GPU-n-0", "-", "here") == ()
    with pytest.raises(InvalidInput, match=r"here: '3g.40gb' must be <profile>@<start>"):
        mig.read_layout(A100, "GPU-n-0", "3g.40gb", "here")
    with pytest.raises(InvalidInput, match=r"here: 3g.40gb@0 and 4g.40gb@0 share"):
        mig.read_layout(A100, "GPU-n-0", "4g.40gb@0,3g.40gb@0", "here")


def test_stranded_counts_the_free_slices_a_profile_of_the_mix_cannot_use() -> None:
    full = [device("4g.40gb", 0), device("3g.40gb", 4)]
    assert mig.stranded(A100, full, {"1g.10gb": 1}) == 0.0
    three_free = [device("4g.40gb", 0)]
    assert mig.stranded(A100, three_free, {"1g.10gb": 1}) == 0.0
    assert mig.stranded(A100, three_free, {"4g.40gb": 1}) == 3.0
    assert mig.stranded(A100, three_free, {"4g.40gb": 1, "1g.10gb": 1}) == 1.5


# -- MIG devices in the state and the fit -------------------------------------------------------
def test_a_gpu_in_mig_mode_is_absent_and_its_devices_are_present() -> None:
    s = ClusterState([mig_node(layout={0: [("1g.10gb", 0), ("3g.40gb", 4)]})])
    uuids = [g.uuid for g in s.nodes[0].gpus]
    assert uuids == ["GPU-n-0", "MIG-GPU-n-0-1g.10gb@0", "MIG-GPU-n-0-3g.40gb@4", "GPU-n-1"]
    assert s.present[0].tolist() == [False, True, True, True]
    assert [s.profiles[k] for k in s.mig_kind[0]] == ["", "1g.10gb", "3g.40gb", ""]
    assert s.usage().gpus == 3
    assert s.nodes[0].gpus[1].label_map()[mig.LABEL_PROFILE] == "1g.10gb"
    assert s.nodes[0].gpus[0].label_map()[mig.LABEL_MODE] == "enabled"


def test_a_gpu_named_as_the_parent_of_a_mig_device_is_never_handed_out() -> None:
    plain = uniform_node("n", 32000, 256 * GIB, 1, "A100-SXM4-80GB", 80 * GIB)
    orphan = partitioned(plain, {"GPU-n-0": [device("1g.10gb", 0)]}).gpus[1]
    node = Node("n", 32000, 256 * GIB, (plain.gpus[0], orphan))  # parent not marked MIG
    s = ClusterState([node])
    assert s.present[0].tolist() == [False, True]
    with pytest.raises(OverCommit, match=r"is in MIG mode: only its MIG devices"):
        s.reserve(Allocation("a", "n", 0, 0, (Slice("GPU-n-0", 0, 81920, 100),), True))


@pytest.mark.parametrize(("request_", "fits"), [
    (asks("3g.40gb"), [False, False, True, False]),
    (asks("1g.10gb"), [False, True, False, False]),
    (pod("w", whole(1)), [False, False, False, True]),
    (pod("s", shared(1, 1024)), [False, False, False, True]),
    (asks("2g.20gb"), [False, False, False, False]),
], ids=["a 3g pod: the 3g device", "a 1g pod: the 1g device", "a whole GPU: the ordinary GPU",
        "a slice: the ordinary GPU", "a profile no device has: nowhere"])
def test_each_demand_lands_on_its_kind_only(request_: PodRequest, fits: list[bool]) -> None:
    s = ClusterState([mig_node(layout={0: [("1g.10gb", 0), ("3g.40gb", 4)]})])
    _, gpu_ok = feasible(s, request_)
    assert gpu_ok is not None and gpu_ok[0].tolist() == fits


def test_explain_says_what_the_node_lacks_for_mig_and_other_pods() -> None:
    s = ClusterState([mig_node(layout={0: [("1g.10gb", 0)], 1: [("7g.80gb", 0)]})])
    reason = explain(s, asks("3g.40gb"), 0)
    assert reason is not None and reason.check is Check.MIG and reason.permanent
    assert reason.message == "1 MIG devices 3g.40gb needed, node has 0"
    whole_gpu = explain(s, pod("w", whole(1)), 0)
    assert whole_gpu is not None and whole_gpu.check is Check.GPU_COUNT
    assert whole_gpu.message == ("1 GPUs needed, node has 0 (and 2 MIG devices, only for pods "
                                 "that ask their profile)")
    s.reserve(Allocation("a", "n", 0, 0, (Slice("MIG-GPU-n-0-1g.10gb@0", 1, 10240, 100),), True))
    busy = explain(s, asks("1g.10gb"), 0)
    assert busy is not None and busy.message == "1 idle MIG devices 1g.10gb needed, 0 idle"


def test_a_mig_pod_is_placed_on_a_device_of_its_profile_whole() -> None:
    s = ClusterState([uniform_node("plain", 32000, 256 * GIB, 2, "A100-SXM4-80GB", 80 * GIB),
                      mig_node(layout={0: [("1g.10gb", s) for s in range(7)]})])
    placer = Placer(make_policy("best-fit", PolicyConfig()))
    decision = placer.decide(s, asks("1g.10gb", 2), random.Random(1))
    assert decision.allocation is not None and decision.allocation.node == "n"
    slices = decision.allocation.slices
    assert [sl.gpu_uuid.startswith("MIG-GPU-n-0-1g.10gb@") for sl in slices] == [True, True]
    assert [(sl.memory_mib, sl.core_pct) for sl in slices] == [(10240, 100)] * 2
    assert decision.allocation.exclusive
    s.reserve(decision.allocation)
    again = placer.decide(s, pod("w", whole(2)), random.Random(1))
    assert again.allocation is not None and again.allocation.node == "plain"


def test_a_pod_cannot_mix_mig_profiles_or_mig_and_slices() -> None:
    one = GpuDemand(1, mode=Mode.EXCLUSIVE, mig_profile="1g.10gb", container="a")
    with pytest.raises(InvalidInput, match=r"different kinds of GPU .*1g.10gb, 3g.40gb"):
        PodRequest("p", 0, 0, (one, GpuDemand(1, mode=Mode.EXCLUSIVE, mig_profile="3g.40gb")))
    with pytest.raises(InvalidInput, match=r"different kinds of GPU"):
        PodRequest("p", 0, 0, (one, GpuDemand(1, 1024)))
    with pytest.raises(InvalidInput, match=r"a MIG device is handed out whole"):
        GpuDemand(1, 1024, mig_profile="1g.10gb")
    with pytest.raises(InvalidInput, match=r"'1g' is not a MIG profile name"):
        GpuDemand(1, mode=Mode.EXCLUSIVE, mig_profile="1g")


def test_the_shape_of_a_request_names_its_profile() -> None:
    assert asks("1g.10gb").shape != asks("3g.40gb").shape


def test_quota_counts_a_mig_device_as_one_gpu_of_its_own_memory() -> None:
    s = ClusterState([mig_node(layout={0: [("1g.10gb", 0), ("3g.40gb", 4)]})])
    amount = request_amount(s, asks("3g.40gb", 1), None)
    assert (amount.gpus, amount.memory_mib, amount.core_pct) == (1, 40960, 100)
    whole_gpu = request_amount(s, pod("w", whole(1)), None)
    assert whole_gpu.memory_mib == 81920


def test_classes_and_groups_select_mig_devices_through_their_gpu() -> None:
    s = ClusterState([mig_node(layout={0: [("1g.10gb", 0), ("3g.40gb", 4)]},
                               labels={"zone": "a"})])
    classes = ClassCatalog([ResourceClass("small", Selector.from_spec(
        {"matchLabels": {mig.LABEL_PROFILE: "1g.10gb"}}))])
    assert classes.gpu_mask(s, "small")[0].tolist() == [False, True, False, False]
    same_memory = ClusterState([mig_node(layout={0: [("1g.20gb", 0), ("2g.20gb", 2)]})])
    wide = ClassCatalog([ResourceClass("wide", Selector.from_spec(
        {"matchLabels": {mig.LABEL_PROFILE: "1g.20gb"}}))])
    assert wide.gpu_mask(same_memory, "wide")[0].tolist() == [False, True, False, False]
    groups = GroupCatalog([ResourceGroup("g", gpus=frozenset({"GPU-n-0"}))])
    assert groups.gpu_mask(s, "g")[0].tolist()[1:3] == [True, True]
    assert not groups.gpu_mask(s, "g")[0][3]


def test_a_node_of_mig_devices_round_trips_through_replace_node_keeping_holders() -> None:
    s = ClusterState([mig_node(layout={0: [("1g.10gb", 0)]})])
    held = Allocation("a", "n", 0, 0, (Slice("MIG-GPU-n-0-1g.10gb@0", 1, 10240, 100),), True)
    s.reserve(held)
    grown = partitioned(s.nodes[0], {"GPU-n-0": [device("1g.10gb", 0), device("3g.40gb", 4)]})
    assert s.replace_node(grown) == []
    assert np.count_nonzero(s.mig_kind[0]) == 2
    assert s.allocations["a"].slices[0].gpu_position == 1


@pytest.mark.parametrize("policy", ["random", "best-fit", "dot-product", "packing",
                                    "clustering", "spread", "fgd", "fgd-balance"])
def test_every_policy_places_mig_pods_on_their_devices_only(policy: str) -> None:
    from gpupool.core.workload import TargetWorkload
    requests = [asks("1g.10gb", key="a"), asks("3g.40gb", key="b"), pod("w", whole(1))]
    config = PolicyConfig(workload=TargetWorkload.from_requests(requests))
    s = ClusterState([mig_node("m", layout={0: [("1g.10gb", 0), ("3g.40gb", 4)],
                                            1: [("7g.80gb", 0)]}),
                      uniform_node("plain", 32000, 256 * GIB, 1, "A100-SXM4-80GB", 80 * GIB)])
    placer = Placer(make_policy(policy, config))
    for request in requests:
        decision = placer.decide(s, request, random.Random(3))
        assert decision.allocation is not None, request.key
        s.reserve(decision.allocation)
    profiles = {a.key: s.nodes[s.node_index(a.node)].gpus[a.slices[0].gpu_position].mig_profile
                for a in s.allocations.values()}
    assert profiles == {"a": "1g.10gb", "b": "3g.40gb", "w": ""}
