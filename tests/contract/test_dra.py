"""The DRA decoder: recorded ResourceSlices and allocated ResourceClaims read into the
core's state (the objects as a real kube-apiserver v1.36 served them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpupool.contract import dra
from gpupool.core.errors import InvalidInput, OverCommit
from gpupool.core.model import Gpu, Node
from gpupool.core.state import ClusterState

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO.parent / "shared" / "fixtures" / "dra-v1"
recorded = pytest.mark.skipif(not FIXTURES.is_dir(), reason="../shared/fixtures/dra-v1 absent")
A100 = "GPU-aaaa0000-0000-0000-0000-000000000000"
T4 = "GPU-bbbb0000-0000-0000-0000-000000000002"


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def recorded_table() -> dra.DeviceTable:
    table, problems = dra.device_table([fixture("resourceslice-consumable-capacity.json")])
    assert problems == []
    return table


def state_of(table: dra.DeviceTable, node: str = "gpu-node-1") -> ClusterState:
    gpus = dra.gpus_of(d for d in table.values() if d.node == node)
    return ClusterState([Node(node, 64_000, 256_000, gpus)])


@recorded
def test_the_recorded_slice_gives_one_device_per_gpu_with_its_uuid_and_memory() -> None:
    table = recorded_table()
    assert sorted(table) == [("gpu-node-1", "gpu-0"), ("gpu-node-1", "gpu-1")]
    a100, t4 = table[("gpu-node-1", "gpu-0")], table[("gpu-node-1", "gpu-1")]
    assert (a100.uuid, a100.index, a100.memory_mib, a100.model) == (A100, 0, 81920,
                                                                     "A100-SXM4-80GB")
    assert (t4.uuid, t4.index, t4.memory_mib, t4.model) == (T4, 2, 15360, "T4")
    assert not a100.tainted and not t4.tainted


@recorded
def test_two_recorded_claims_share_the_a100_each_with_10_gib_and_30_cores() -> None:
    table = recorded_table()
    claims = fixture("resourceclaims-allocated-shared-device.json")["items"]
    holdings = [dra.read_claim(c, table) for c in claims]
    assert [h.ref for h in holdings if h] == ["dra-demo/dra-a-gpu-sqmq8",
                                              "dra-demo/dra-b-gpu-kq7rx"]
    for h in holdings:
        assert h is not None and h.node == "gpu-node-1" and not h.exclusive
        assert [(g.device.uuid, g.memory_mib, g.core_pct, g.request) for g in h.gpus] == [
            (A100, 10240, 30, "gpu")]
    assert holdings[0] is not None and holdings[0].pods == (
        "358ff4cf-8021-4ed6-b97e-69b858f4e788",)


@recorded
def test_the_recorded_claims_reserve_20_gib_and_60_cores_of_the_a100_in_the_core() -> None:
    table = recorded_table()
    state = state_of(table)
    for c in fixture("resourceclaims-allocated-shared-device.json")["items"]:
        h = dra.read_claim(c, table)
        assert h is not None
        state.reserve(dra.allocation_of(h, state.gpu_position, state.memory_unit_mib))
    j = state.gpu_position("gpu-node-1", A100)
    assert int(state.unit_free[0, j]) * 256 == 81920 - 2 * 10240
    assert int(state.core_free[0, j]) == 40
    t4 = state.gpu_position("gpu-node-1", T4)
    assert int(state.core_free[0, t4]) == 100
    assert sorted(state.allocations) == ["resourceclaim/1201ee14-9730-4742-a35e-4a96d3667cbe",
                                         "resourceclaim/d0b5b6ad-a619-4792-b369-1722839bd5ce"]


@recorded
def test_decoding_the_same_claim_twice_reserves_it_once() -> None:
    table = recorded_table()
    state = state_of(table)
    claim = fixture("resourceclaims-allocated-shared-device.json")["items"][0]
    for _ in range(2):
        h = dra.read_claim(claim, table)
        assert h is not None
        state.reserve(dra.allocation_of(h, state.gpu_position, 256))
    assert int(state.core_free[0, 0]) == 70


def claim(results: list[dict[str, Any]], capacity: dict[str, str] | None = None,
          reserved: tuple[str, ...] = ("p1",)) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "gpu.gpupool.io", "count": len(results)}
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    return {"metadata": {"namespace": "ns", "name": "c", "uid": "u1"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
            "status": {"allocation": {"devices": {"results": results}},
                       "reservedFor": [{"resource": "pods", "name": p, "uid": p}
                                       for p in reserved]}}


def result(device: str, consumed: dict[str, str] | None = None,
           driver: str = dra.DRIVER) -> dict[str, Any]:
    r: dict[str, Any] = {"driver": driver, "pool": "n1", "device": device, "request": "gpu"}
    if consumed is not None:
        r["consumedCapacity"] = consumed
    return r


TABLE = dra.devices_of_node("n1", [Gpu("GPU-0", 0, "A100", 40_000), Gpu("GPU-1", 1, "A100",
                                                                        40_000)], 256)


def test_a_claim_that_asks_no_capacity_holds_its_devices_whole() -> None:
    h = dra.read_claim(claim([result("gpu-0"), result("gpu-1")]), TABLE)
    assert h is not None and h.exclusive
    state = ClusterState([Node("n1", 1000, 1000, dra.gpus_of(TABLE.values()))])
    state.reserve(dra.allocation_of(h, state.gpu_position, 256))
    assert state.unit_free[0].tolist() == [0, 0] and state.core_free[0].tolist() == [0, 0]


def test_a_dimension_the_claim_did_not_ask_is_consumed_as_recorded() -> None:
    h = dra.read_claim(claim([result("gpu-0", {"memory": "39936Mi", "cores": "20"})],
                             {"cores": "20"}), TABLE)
    assert h is not None and [(g.memory_mib, g.core_pct, g.whole) for g in h.gpus] == [
        (39936, 20, False)]


def test_unallocated_claims_and_other_drivers_results_hold_nothing() -> None:
    assert dra.read_claim(claim([]), TABLE) is None
    assert dra.read_claim(claim([result("gpu-0", driver="gpu.nvidia.com")]), TABLE) is None


@pytest.mark.parametrize(("results", "message"), [
    ([result("gpu-7", {"memory": "1Gi", "cores": "1"})], "gpu-7 is not published"),
    ([result("gpu-0", {"memory": "1Gi", "cores": "150"})], "exceed the device"),
    ([result("gpu-0", {"memory": "lots", "cores": "1"})], "not a Kubernetes quantity"),
    ([result("gpu-0", {"memory": "-1Gi", "cores": "1"})], "negative"),
])
def test_a_broken_claim_is_refused_with_the_claim_and_field_named(
        results: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(InvalidInput, match=message) as err:
        dra.read_claim(claim(results, {"memory": "1Gi"}), TABLE)
    assert "ResourceClaim ns/c" in str(err.value)


def test_a_claim_larger_than_what_is_free_does_not_reserve() -> None:
    state = ClusterState([Node("n1", 1000, 1000, dra.gpus_of(TABLE.values()))])
    big = dra.read_claim(claim([result("gpu-0", {"memory": "30000Mi", "cores": "80"})],
                               {"memory": "30000Mi"}), TABLE)
    assert big is not None
    state.reserve(dra.allocation_of(big, state.gpu_position, 256))
    second = {**claim([result("gpu-0", {"memory": "10Gi", "cores": "30"})], {"cores": "30"}),
              "metadata": {"namespace": "ns", "name": "d", "uid": "u2"}}
    h = dra.read_claim(second, TABLE)
    assert h is not None
    with pytest.raises(OverCommit):
        state.reserve(dra.allocation_of(h, state.gpu_position, 256))


@pytest.mark.parametrize(("key", "expected"), [
    ("gpupool.io/model", ("gpupool.io", "model")),
    ("tier", (dra.LABEL_DOMAIN, "tier")),
    ("nvidia.com/gpu.product", ("nvidia.com", "gpu_dproduct")),
    ("example.com/nv-link_gen", ("example.com", "nv_hlink__gen")),
    ("example.com/3d", ("example.com", "_3d")),
    ("example.com/" + "x" * 40, None),
    ("Not_A_Domain/x", None),
])
def test_labels_become_attribute_names_without_collisions(
        key: str, expected: tuple[str, str] | None) -> None:
    assert dra.label_attribute(key) == expected


def test_quantities_are_written_as_the_api_server_writes_them_back() -> None:
    assert [dra.binary_quantity(m) for m in (81920, 15360, 256, 1536, 0)] == [
        "80Gi", "15Gi", "256Mi", "1536Mi", "0"]
