"""The node's ResourceSlice as the FAKE API server receives it: the recorded shape of a
real v1.36 slice, gpupool's accounting units, health as device taints, generations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract import dra
from gpupool.nodeagent.dra.claimsource import KubeDraCluster

from ..builders import NODE, uuid_of, wait_for
from .conftest import DraFactory

FIXTURES = Path(__file__).resolve().parents[3].parent / "shared" / "fixtures" / "dra-v1"
recorded = pytest.mark.skipif(not FIXTURES.is_dir(), reason="../shared/fixtures/dra-v1 absent")
SLICE = dra.slice_name(NODE)


def published(apiserver: FakeApiServer) -> dict[str, Any]:
    obj = apiserver.get("resourceslices", SLICE)
    assert obj is not None
    return obj


def shape(value: Any) -> Any:
    """The keys of nested maps, and the types of leaves (lists: the shape of each item)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value]
    return type(value).__name__


@recorded
def test_the_slice_has_the_shape_of_the_recorded_v1_36_slice(
        make_dra: DraFactory, apiserver: FakeApiServer) -> None:
    agent = make_dra(gpus=2)
    assert agent.published.wait(30)
    ours = published(apiserver)
    theirs = json.loads((FIXTURES / "resourceslice-consumable-capacity.json").read_text())
    assert ours["apiVersion"] == theirs["apiVersion"] and ours["kind"] == theirs["kind"]
    assert shape(ours["spec"]["pool"]) == shape(theirs["spec"]["pool"])
    assert set(ours["spec"]) == set(theirs["spec"])
    recorded_device = theirs["spec"]["devices"][0]
    for device in ours["spec"]["devices"]:
        assert set(recorded_device) <= set(device)
        for name, value in recorded_device["attributes"].items():
            assert shape(device["attributes"][name]) == shape(value), name
        for name in ("memory", "cores"):
            mine, rec = device["capacity"][name], recorded_device["capacity"][name]
            assert set(rec) == set(mine) and set(rec["requestPolicy"]) == set(
                mine["requestPolicy"])
            assert set(rec["requestPolicy"]["validRange"]) <= set(
                mine["requestPolicy"]["validRange"])
    assert (ours["spec"]["driver"], ours["spec"]["nodeName"]) == (dra.DRIVER, NODE)
    assert ours["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    table, problems = dra.device_table([ours])
    assert problems == [] and sorted(d.uuid for d in table.values()) == [uuid_of(0),
                                                                        uuid_of(1)]


def test_devices_offer_gpupool_units_and_every_class_label(
        make_dra: DraFactory, apiserver: FakeApiServer) -> None:
    agent = make_dra(gpus=1, memory_mib=16000)
    assert agent.published.wait(30)
    device = published(apiserver)["spec"]["devices"][0]
    assert device["name"] == "gpu-0" and device["allowMultipleAllocations"] is True
    assert device["capacity"]["memory"] == {"value": "15872Mi", "requestPolicy": {
        "default": "15872Mi", "validRange": {"min": "256Mi", "step": "256Mi",
                                             "max": "15872Mi"}}}
    assert device["capacity"]["cores"]["requestPolicy"]["validRange"] == {
        "min": "1", "step": "1", "max": "100"}
    attrs = device["attributes"]
    assert attrs["uuid"] == {"string": uuid_of(0)} and attrs["index"] == {"int": 0}
    assert attrs["gpupool.io/model"] == {"string": "A100-SXM4-80GB"}
    assert attrs["gpupool.io/memory"] == {"string": "16000Mi"}
    assert attrs["gpupool.io/architecture"] == {"string": "ampere"}
    assert attrs["labels.gpupool.io/nvlink"] == {"string": "true"}
    assert attrs["gpupool.io/node_hmode"] == {"string": "dra"}
    assert attrs["gpupool.io/isolation_hprovider"] == {"string": "none"}
    assert len(attrs) + len(device["capacity"]) <= dra.MAX_ATTRIBUTES


def test_an_unhealthy_gpu_is_tainted_in_a_new_generation_and_untainted_when_it_recovers(
        make_dra: DraFactory, apiserver: FakeApiServer) -> None:
    agent = make_dra(gpus=2)
    assert agent.published.wait(30)
    agent.backend.set_health(uuid_of(1), False, "XID 79: fell off the bus")  # type: ignore
    wait_for(lambda: published(apiserver)["spec"]["pool"]["generation"] == 2)
    devices = published(apiserver)["spec"]["devices"]
    assert "taints" not in devices[0]
    taint = devices[1]["taints"][0]
    assert (taint["key"], taint["effect"]) == (dra.TAINT_UNHEALTHY, "NoSchedule")
    assert taint["value"] == "XID-79-fell-off-the-bus"
    table, _ = dra.device_table([published(apiserver)])
    assert table[(NODE, "gpu-1")].tainted
    agent.backend.set_health(uuid_of(1), True)  # type: ignore[attr-defined]
    wait_for(lambda: published(apiserver)["spec"]["pool"]["generation"] == 3)
    assert "taints" not in published(apiserver)["spec"]["devices"][1]


def test_an_unchanged_node_writes_nothing_and_a_restart_keeps_the_generation(
        make_dra: DraFactory, apiserver: FakeApiServer) -> None:
    first = make_dra(gpus=2, resync_s=0.05)
    assert first.published.wait(30)
    first.published.clear()
    assert first.published.wait(30)
    assert first.publisher.writes == 1
    first.stop()
    second = make_dra(gpus=2, write=False)
    assert second.published.wait(30)
    assert second.publisher.writes == 0 and second.publisher.generation == 1


def test_other_slices_of_the_node_are_removed_and_other_nodes_left_alone(
        make_dra: DraFactory, apiserver: FakeApiServer) -> None:
    for name, node in (("old-name", NODE), ("node-b-gpu.gpupool.io", "node-b")):
        apiserver.seed("resourceslices", {"metadata": {"name": name}, "spec": {
            "driver": dra.DRIVER, "nodeName": node, "pool": {"name": node, "generation": 4,
                                                             "resourceSliceCount": 1},
            "devices": []}})
    agent = make_dra(gpus=1)
    assert agent.published.wait(30)
    names = sorted(o["metadata"]["name"] for o in apiserver.objects("resourceslices"))
    assert names == ["node-a-gpu.gpupool.io", "node-b-gpu.gpupool.io"]


class DroppingTaints(KubeDraCluster):
    """The API server with DRADeviceTaints off: it drops ``taints`` from the devices it
    stores, as kube-apiserver drops the fields of a disabled feature."""

    def _dropped(self, obj: Any) -> Any:
        for d in obj["spec"]["devices"]:
            d.pop("taints", None)
        return obj

    def create_resource_slice(self, obj: Any) -> Any:
        return super().create_resource_slice(self._dropped(json.loads(json.dumps(obj))))

    def replace_resource_slice(self, obj: Any) -> Any:
        return super().replace_resource_slice(self._dropped(json.loads(json.dumps(obj))))


def test_without_device_taints_an_unhealthy_gpu_leaves_the_slice(
        make_dra: DraFactory, apiserver: FakeApiServer) -> None:
    agent = make_dra(gpus=2)
    assert agent.published.wait(30)
    agent.publisher.api = DroppingTaints(agent.publisher.api.api)  # type: ignore[attr-defined]
    agent.backend.set_health(uuid_of(0), False, "XID 48")  # type: ignore[attr-defined]
    wait_for(lambda: [d["name"] for d in published(apiserver)["spec"]["devices"]] == ["gpu-1"])
    assert agent.publisher.taints_kept is False
    assert published(apiserver)["spec"]["pool"]["generation"] == 3


def test_dra_nodes_still_publish_gpudevices_marked_with_their_mode(
        make_dra: DraFactory, apiserver: FakeApiServer) -> None:
    make_dra(gpus=1, inventory=True)
    wait_for(lambda: len(apiserver.objects("gpudevices")) == 1)
    labels = apiserver.objects("gpudevices")[0]["spec"]["labels"]
    assert labels[dra.NODE_MODE_LABEL] == dra.MODE_DRA
