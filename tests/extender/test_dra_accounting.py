"""One node, one mode: the extender counts the ResourceClaims kube-scheduler allocated on
DRA nodes in the same state as its own decisions, and keeps device-plugin pods off DRA
nodes (the recorded v1.36 objects: two claims sharing one A100)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from lightkube.resources.core_v1 import Node

from gpupool.contract import dra
from gpupool.core.errors import InvalidInput
from gpupool.extender.metrics import Metrics
from gpupool.extender.service import Extender, Settings
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.state.draclaims import SOURCE
from gpupool.extender.state.signatures import DecisionCheck

from .builders import gpu_obj, local_keys, node_obj, pod_obj

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "dra-v1"
recorded = pytest.mark.skipif(not FIXTURES.is_dir(), reason="../shared/fixtures/dra-v1 absent")
A100 = "GPU-aaaa0000-0000-0000-0000-000000000000"
T4 = "GPU-bbbb0000-0000-0000-0000-000000000002"
DRA_NODE = "gpu-node-1"
CLAIM_A, CLAIM_B = "d0b5b6ad-a619-4792-b369-1722839bd5ce", "1201ee14-9730-4742-a35e-4a96d3667cbe"
MODE = {dra.NODE_MODE_LABEL: dra.MODE_DRA}


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def recorded_claims() -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = fixture("resourceclaims-allocated-shared-device.json")["items"]
    return items


def dra_gpus() -> list[dict[str, Any]]:
    """The recorded node's GPUs as its agent publishes GPUDevices (labelled with the mode)."""
    a100 = gpu_obj(DRA_NODE, 0, "A100-SXM4-80GB", 81920, labels=MODE)
    t4 = gpu_obj(DRA_NODE, 2, "T4", 15360, labels=MODE)
    a100["spec"]["uuid"], t4["spec"]["uuid"] = A100, T4
    a100["metadata"]["name"], t4["metadata"]["name"] = A100.lower(), T4.lower()
    return [a100, t4]


def mixed_cache(node_label: bool = True) -> ClusterCache:
    """A DRA node (the recorded one) beside a device-plugin node ``plain`` of 2 A100s."""
    cache = ClusterCache(decisions=DecisionCheck(local_keys()))
    labels = {"kubernetes.io/hostname": DRA_NODE, **(MODE if node_label else {})}
    cache.sync_nodes([Node.from_dict(node_obj(DRA_NODE, labels=labels)),
                      Node.from_dict(node_obj("plain"))])
    cache.sync_devices([*dra_gpus(), gpu_obj("plain", 0, memory_mib=81920),
                        gpu_obj("plain", 1, memory_mib=81920)])
    return cache


def free_on(cache: ClusterCache, uuid: str) -> tuple[int, int]:
    """(free MiB, free percent) of one GPU in the cache's state."""
    cache.flush()
    state = cache.state
    i = state.index[DRA_NODE]
    j = state.gpu_position(DRA_NODE, uuid)
    return int(state.unit_free[i, j]) * state.memory_unit_mib, int(state.core_free[i, j])


def with_claims(cache: ClusterCache, slices: bool = True) -> ClusterCache:
    with cache.lock:
        if slices:
            cache.dra.sync_slices(cache, [fixture("resourceslice-consumable-capacity.json")])
        cache.dra.sync_claims(cache, recorded_claims())
    return cache


@recorded
def test_the_two_recorded_claims_on_one_a100_are_each_held_once_with_what_they_consumed(
) -> None:
    cache = with_claims(mixed_cache())
    keys = {dra.claim_key(CLAIM_A), dra.claim_key(CLAIM_B)}
    assert keys <= set(cache.state.allocations)
    assert all(cache.sources[k] == {SOURCE} for k in keys)
    assert free_on(cache, A100) == (81920 - 2 * 10240, 100 - 2 * 30)
    assert free_on(cache, T4) == (15360, 100)
    usage = cache.state.usage()
    assert usage.gpus == 4  # 2 GPUs of the DRA node + 2 of the device-plugin node, once each
    assert usage.allocated_milli == 600  # the larger share of the A100: 60 percent of compute


@recorded
def test_listing_the_claims_again_changes_nothing_and_a_deleted_claim_frees_its_share() -> None:
    cache = with_claims(mixed_cache())
    with cache.lock:
        cache.dra.sync_claims(cache, recorded_claims())  # a relist: idempotent
    assert free_on(cache, A100) == (61440, 40)
    with cache.lock:
        cache.dra.claim_event(cache, "DELETED", recorded_claims()[0])
    assert free_on(cache, A100) == (71680, 70)
    assert dra.claim_key(CLAIM_A) not in cache.state.allocations


@recorded
def test_a_deallocated_claim_holds_nothing_and_a_listing_without_it_forgets_it() -> None:
    cache = with_claims(mixed_cache())
    released = copy.deepcopy(recorded_claims()[1])
    del released["status"]["allocation"]
    with cache.lock:
        cache.dra.claim_event(cache, "MODIFIED", released)
    assert free_on(cache, A100) == (71680, 70)
    assert cache.dra.record("dra-demo", "dra-b-gpu-kq7rx") is not None
    with cache.lock:
        cache.dra.sync_claims(cache, [])
    assert free_on(cache, A100) == (81920, 100)
    assert cache.dra.record("dra-demo", "dra-b-gpu-kq7rx") is None


@recorded
def test_claims_read_before_any_slice_map_devices_through_the_nodes_gpudevices() -> None:
    cache = with_claims(mixed_cache(), slices=False)
    assert free_on(cache, A100) == (61440, 40)
    assert cache.dra.unreadable == {}


@recorded
def test_a_claim_on_a_device_nobody_publishes_is_not_counted_and_says_why() -> None:
    cache = mixed_cache()
    stray = copy.deepcopy(recorded_claims()[0])
    stray["status"]["allocation"]["devices"]["results"][0]["pool"] = "gone-node"
    with cache.lock:
        cache.dra.sync_claims(cache, [stray])
    assert dra.claim_key(CLAIM_A) not in cache.state.allocations
    assert "gone-node/gpu-0 is not published" in cache.dra.unreadable[CLAIM_A]


@recorded
def test_a_node_laid_out_again_keeps_counting_its_claims() -> None:
    cache = with_claims(mixed_cache())
    cache.device_event("DELETED", dra_gpus()[0])  # the A100 leaves: its claims with it
    cache.device_event("DELETED", dra_gpus()[1])
    cache.flush()
    assert DRA_NODE not in cache.state.index
    for gpu in dra_gpus():
        cache.device_event("ADDED", gpu)
    assert free_on(cache, A100) == (61440, 40)  # held again once the node is back
    with cache.lock:
        cache.sync_nodes([Node.from_dict(node_obj(DRA_NODE, labels=MODE)),
                          Node.from_dict(node_obj("plain"))])  # a full rebuild too
    assert free_on(cache, A100) == (61440, 40)


def extender(cache: ClusterCache, policy: str = "best-fit") -> Extender:
    return Extender(cache, Settings(policy), Metrics())


def gpu_pod(name: str, limits: dict[str, Any]) -> dict[str, Any]:
    pod = pod_obj(name, limits)
    pod["metadata"]["uid"] = f"uid-{name}"
    return pod


@pytest.mark.parametrize("node_label", [True, False], ids=["node label", "GPUDevice labels"])
def test_a_device_plugin_pod_is_refused_on_a_dra_node_naming_the_nodes_mode(
        node_label: bool) -> None:
    ext = extender(mixed_cache(node_label))
    pod = gpu_pod("p", {"gpupool.io/gpu": "1", "gpupool.io/gpu-memory": "1024"})
    answer = ext.filter({"Pod": pod, "NodeNames": [DRA_NODE, "plain"]})
    assert answer["NodeNames"] == ["plain"]
    why = answer["FailedAndUnresolvableNodes"][DRA_NODE]
    assert "gpupool.io/node-mode=dra" in why and "ResourceClaim" in why
    assert answer["FailedNodes"] == {}


def test_a_device_plugin_pod_that_fits_only_on_a_dra_node_fits_nowhere() -> None:
    ext = extender(mixed_cache())
    pod = gpu_pod("t4", {"class.gpupool.io/none": "1"})
    ext.cache.class_event("ADDED", {"metadata": {"name": "none"}, "spec": {"selector": {
        "matchLabels": {"gpupool.io/model": "T4"}}}})  # only the DRA node has a T4
    answer = ext.filter({"Pod": pod, "NodeNames": [DRA_NODE, "plain"]})
    assert answer["NodeNames"] == []
    assert "node-mode=dra" in answer["FailedAndUnresolvableNodes"][DRA_NODE]
    assert "plain" in answer["FailedAndUnresolvableNodes"]


def test_a_cluster_without_dra_nodes_filters_as_before() -> None:
    cache = ClusterCache(decisions=DecisionCheck(local_keys()))
    cache.sync_nodes([Node.from_dict(node_obj("a"))])
    cache.sync_devices([gpu_obj("a", 0)])
    c = cache.modes.constraints(cache.state, extender(cache)._request(
        gpu_pod("p", {"gpupool.io/gpu": "1"})), cache.catalogue)
    assert c.excluded is None and c.node_mask is None


@recorded
def test_a_broken_claim_record_is_refused_by_the_decoder_not_the_cache() -> None:
    cache = mixed_cache()
    broken = copy.deepcopy(recorded_claims()[0])
    broken["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]["cores"] = "x"
    with cache.lock:
        cache.dra.sync_claims(cache, [broken])
    assert "consumedCapacity" in cache.dra.unreadable[CLAIM_A]
    with pytest.raises(InvalidInput):
        dra.read_claim(broken, cache.dra.table(cache.state))


@recorded
def test_a_slice_arriving_later_is_what_a_waiting_claim_is_read_against() -> None:
    cache = mixed_cache()
    on_t4 = copy.deepcopy(recorded_claims()[0])
    on_t4["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-1"  # the T4
    with cache.lock:
        cache.dra.sync_claims(cache, [on_t4])  # no slice yet: no GPU of index 1 there
    assert CLAIM_A in cache.dra.unreadable
    with cache.lock:
        cache.dra.slice_event(cache, "ADDED", fixture("resourceslice-consumable-capacity.json"))
    assert cache.dra.unreadable == {}
    assert free_on(cache, T4) == (15360 - 10240, 70)
    assert free_on(cache, A100) == (81920, 100)
