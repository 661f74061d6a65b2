"""The GPUDevice reader of the contract: what the CRD allows is read, anything else is
refused with the object and the field named. The extender and the controller both
read GPUDevices with it (tests/controller: the controller's view of health)."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.contract.devices import ARCHITECTURE_LABEL, read_device
from gpupool.core.errors import InvalidInput


def device(**spec: Any) -> dict[str, Any]:
    full = {"node": "n1", "uuid": "GPU-1", "index": 0, "model": "A100", "memoryMiB": 40960,
            **spec}
    return {"metadata": {"name": "gpu-1", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {k: v for k, v in full.items() if v is not None},
            "status": {"health": "Healthy", "heartbeatTime": "2026-01-01T00:01:00Z"}}


def test_a_full_device_is_read_with_its_labels_and_times() -> None:
    rec = read_device(device(numaNode=1, architecture="ampere", labels={"zone": "a", "n": 3}))
    assert (rec.name, rec.node, rec.gpu.uuid, rec.gpu.index) == ("gpu-1", "n1", "GPU-1", 0)
    assert (rec.gpu.model, rec.gpu.memory_mib, rec.gpu.numa_node) == ("A100", 40960, 1)
    assert dict(rec.gpu.labels) == {ARCHITECTURE_LABEL: "ampere", "zone": "a", "n": "3"}
    assert rec.reported_healthy and rec.gpu.healthy
    assert rec.heartbeat_s is not None and rec.created_s is not None
    assert rec.heartbeat_s - rec.created_s == 60


def test_optional_fields_take_their_defaults() -> None:
    obj = device(model=None)
    del obj["status"]
    rec = read_device(obj)
    assert (rec.gpu.model, rec.gpu.numa_node, rec.gpu.labels) == ("unknown", 0, ())
    assert rec.reported_healthy and rec.heartbeat_s is None


def test_reported_health_is_kept_beside_a_gpu_marked_healthy() -> None:
    obj = device()
    obj["status"] = {"health": "Unhealthy", "heartbeatTime": "not a time"}
    rec = read_device(obj)
    assert not rec.reported_healthy and rec.gpu.healthy and rec.heartbeat_s is None


@pytest.mark.parametrize("spec, field", [
    ({"node": ""}, "spec.node"),
    ({"uuid": 7}, "spec.uuid"),
    ({"index": -1}, "spec.index"),
    ({"index": True}, "spec.index"),
    ({"index": "0"}, "spec.index"),
    ({"memoryMiB": 0}, "spec.memoryMiB"),
    ({"memoryMiB": 1.5}, "spec.memoryMiB"),
    ({"model": 80}, "spec.model"),
    ({"numaNode": -1}, "spec.numaNode"),
    ({"numaNode": "1"}, "spec.numaNode"),
    ({"labels": ["a"]}, "spec.labels"),
])
def test_a_field_against_the_crd_is_named_in_the_error(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput, match=f"GPUDevice gpu-1: .*{field}"):
        read_device(device(**spec))


def test_spec_and_status_must_be_objects() -> None:
    for broken in ({"metadata": {"name": "gpu-1"}},
                   {**device(), "status": "Healthy"}, {**device(), "spec": []}):
        with pytest.raises(InvalidInput, match="GPUDevice gpu-1: spec and status"):
            read_device(broken)



def test_an_isolated_gpu_keeps_its_health_but_takes_no_placements() -> None:
    obj = {"metadata": {"name": "gpu-a"},
           "spec": {"node": "n1", "uuid": "GPU-a", "index": 0, "memoryMiB": 1024},
           "status": {"health": "Healthy",
                      "isolation": {"state": "Isolated", "reason": "pod a/b used 9 GiB of 1"}}}
    dev = read_device(obj)
    assert dev.reported_healthy and dev.isolated and not dev.takes_placements
    assert dev.isolation_reason == "pod a/b used 9 GiB of 1"
    obj["status"]["isolation"] = {"state": "None"}
    assert read_device(obj).takes_placements
    obj["status"]["isolation"] = "garbage"
    assert read_device(obj).takes_placements


@pytest.mark.parametrize("links, field", [
    ({}, r"spec.links must be a list"),
    (["GPU-b"], r"spec.links\[0\] must be an object"),
    ([{"nvlinks": 2}], r"spec.links\[0\].peer must be a GPU uuid"),
    ([{"peer": "GPU-b", "nvlinks": -1}], r"spec.links\[0\]: nvlinks and nvlinkVersion"),
    ([{"peer": "GPU-b", "pcie": "PIX"}], r"spec.links\[0\].pcie: PCIe path 'PIX'"),
])
def test_a_broken_link_is_named_with_its_entry(links: Any, field: str) -> None:
    with pytest.raises(InvalidInput, match=f"GPUDevice gpu-1: {field}"):
        read_device(device(links=links))


def test_links_are_read_into_the_gpu_and_degraded_counts_as_healthy() -> None:
    from gpupool.core.topology import Link, PciePath
    obj = device(links=[{"peer": "GPU-b", "nvlinks": 12, "nvlinkVersion": 3,
                         "pcie": "NUMANode"}, {"peer": "GPU-c", "pcie": "System"}])
    obj["status"] = {"health": "Healthy", "healthLevel": "Degraded", "reason": "hot"}
    dev = read_device(obj)
    assert dev.gpu.links == (("GPU-b", Link(12, 3, PciePath.NUMA_NODE)),
                             ("GPU-c", Link(pcie=PciePath.SYSTEM)))
    assert dev.reported_healthy and dev.takes_placements
