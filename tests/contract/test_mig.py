"""MIG as components exchange it: pod resources, GPUDevice spec.mig, the webhook's count."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.contract import mig
from gpupool.contract.devices import read_device
from gpupool.contract.podspec_request import pod_request
from gpupool.core.errors import InvalidInput
from gpupool.core.mig import MigDevice, MigMode
from gpupool.core.request import Mode


def mig_pod(limits: dict[str, str], annotations: dict[str, str] | None = None
            ) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "team-a", "uid": "u1",
                         "annotations": annotations or {}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}


def test_a_container_asks_mig_devices_of_a_profile_by_resource() -> None:
    request = pod_request(mig_pod({"mig.gpupool.io/3g.40gb": "2", "gpupool.io/gpu": "2"}))
    (demand,) = request.gpus
    assert (demand.count, demand.mode, demand.mig_profile) == (2, Mode.EXCLUSIVE, "3g.40gb")
    assert mig.resource_name("1g.10gb") == "mig.gpupool.io/1g.10gb"
    assert mig.profile_of_resource("gpupool.io/gpu") is None
    assert not pod_request(mig_pod({"mig.gpupool.io/1g.10gb": "0"})).gpus


@pytest.mark.parametrize(("limits", "annotations", "message"), [
    ({"mig.gpupool.io/1g.10gb": "1", "gpupool.io/gpu-core": "20"}, None,
     "mig.gpupool.io/1g.10gb asks whole MIG devices; it cannot be combined with"),
    ({"mig.gpupool.io/1g.10gb": "1", "class.gpupool.io/big": "1"}, None,
     "cannot be combined with"),
    ({"mig.gpupool.io/1g.10gb": "1", "gpupool.io/gpu": "3"}, None,
     "gpupool.io/gpu=3 disagrees with mig.gpupool.io/1g.10gb=1"),
    ({"mig.gpupool.io/1g.10gb": "1", "mig.gpupool.io/2g.20gb": "1"}, None,
     "asks MIG devices of several profiles"),
    ({"mig.gpupool.io/big": "1"}, None, "mig.gpupool.io/big names no MIG profile"),
    ({"mig.gpupool.io/1g.10gb": "1"}, {"gpupool.io/mode": "shared"},
     "gpupool.io/mode=shared, but a MIG device is handed out whole"),
    ({"mig.gpupool.io/1g.10gb": "half"}, None, "quantity 'half' is not"),
], ids=["with a slice", "with a class", "another count", "two profiles", "not a profile",
        "shared mode", "not a number"])
def test_a_mig_ask_gpupool_cannot_read_is_refused_naming_the_container(
        limits: dict[str, str], annotations: dict[str, str] | None, message: str) -> None:
    with pytest.raises(InvalidInput, match="pod team-a/p container c") as err:
        pod_request(mig_pod(limits, annotations))
    assert message in str(err.value)


def test_two_containers_asking_different_profiles_are_refused() -> None:
    obj = mig_pod({"mig.gpupool.io/1g.10gb": "1"})
    obj["spec"]["containers"].append(
        {"name": "d", "resources": {"limits": {"mig.gpupool.io/3g.40gb": "1"}}})
    with pytest.raises(InvalidInput, match="different kinds of GPU"):
        pod_request(obj)


def device_obj(uuid: str, spec_mig: Any, memory: int = 10240) -> dict[str, Any]:
    return {"metadata": {"name": "gpu-x"},
            "spec": {"node": "n1", "uuid": uuid, "index": 0, "memoryMiB": memory,
                     "model": "A100-SXM4-80GB", "mig": spec_mig}, "status": {}}


def test_spec_mig_round_trips_through_the_gpudevice() -> None:
    device = MigDevice("GPU-a", "1g.10gb", 3, 1, 1, 9, 0)
    assert mig.read_mig(mig.mig_spec(device), "here") == device
    assert mig.read_mig(mig.mig_spec(MigMode()), "here") == MigMode()
    assert mig.mig_spec(None) is None
    record = read_device(device_obj("MIG-1", mig.mig_spec(device)))
    assert record.gpu.mig == device and record.gpu.mig_profile == "1g.10gb"
    parent = read_device(device_obj("GPU-a", {"mode": "Enabled"}, 81920))
    assert parent.gpu.in_mig_mode


@pytest.mark.parametrize(("spec_mig", "message"), [
    ("yes", "spec.mig must be an object"),
    ({"mode": "On"}, "a GPU in MIG mode says mode: Enabled"),
    ({"parent": "GPU-a", "profile": "1g.10gb"}, "spec.mig.placement must be an object"),
    ({"parent": "GPU-a", "profile": "1g.10gb", "placement": {"start": 9, "size": 1},
      "slices": 1}, "placement 9:1 is outside the GPU's 8 memory slices"),
    ({"parent": "GPU-a", "profile": "1g.10gb", "placement": {"start": 0, "size": 1},
      "slices": "1"}, "slices must be a whole number"),
], ids=["not an object", "unknown mode", "no placement", "outside the GPU", "slices text"])
def test_a_broken_spec_mig_names_the_object_and_field(spec_mig: Any, message: str) -> None:
    with pytest.raises(InvalidInput, match=r"GPUDevice gpu-x: spec\.mig") as err:
        read_device(device_obj("MIG-1", spec_mig))
    assert message in str(err.value)
