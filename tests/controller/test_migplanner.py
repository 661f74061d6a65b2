"""MIG on demand in the controller: which GPU it asks to repartition for waiting pods, and
what it leaves alone (GPUs already asked, pods a free device can take, GPUs in use)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract import mig as contract
from gpupool.controller.migplanner import MigPlanner, asks
from gpupool.controller.observed import Observed, Tenancy, observe
from gpupool.core.allocation import Slice
from gpupool.kube.controller_ops import ControllerApi

from .builders import device, placed_pod


def mig_gpu(node: str, index: int, *devices: tuple[str, int, int, int, int]
            ) -> list[dict[str, Any]]:
    """A GPU in MIG mode and its MIG devices (profile, start, size, slices, MiB)."""
    parent = device(node, index)
    parent["spec"]["mig"] = {"mode": "Enabled"}
    out = [parent]
    for profile, start, size, slices, mib in devices:
        d = device(node, index, memory_mib=mib)
        uuid = f"MIG-{node}-{index}-{profile}@{start}"
        d["metadata"]["name"] = uuid.lower().replace("@", "-").replace(".", "-")
        d["spec"].update(uuid=uuid, mig={"parent": f"GPU-{node}-{index}", "profile": profile,
                                         "placement": {"start": start, "size": size},
                                         "slices": slices})
        out.append(d)
    return out


def waiting(name: str, profile: str, count: int = 1, created: str = "2026-01-01T00:00:00Z"
            ) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}",
                         "creationTimestamp": created},
            "spec": {"containers": [{"name": "main", "resources": {"limits": {
                contract.resource_name(profile): str(count)}}}]},
            "status": {"phase": "Pending"}}


def listed(devices: list[dict[str, Any]], pods: list[dict[str, Any]]) -> Observed:
    """What the loop observes, with TenantQuotas and GPUPermissions listed (none)."""
    return replace(observe(devices, [], [], pods), tenancy=Tenancy())


def run(devices: list[dict[str, Any]], pods: list[dict[str, Any]]) -> list[tuple[str, str]]:
    observed = listed(devices, pods)
    return [(a.device, a.layout) for a in asks(observed, devices, pods)]


def test_a_waiting_pod_gets_the_device_that_strands_least() -> None:
    devices = mig_gpu("n1", 0, ("1g.10gb", 0, 1, 1, 10240)) + mig_gpu("n1", 1)
    # 3g.40gb beside the 1g would leave 3 slices no 3g fits: the empty GPU takes it
    assert run(devices, [waiting("p", "3g.40gb")]) == [("gpu-n1-1", "3g.40gb@0")]
    # a 1g strands nothing either way: the GPU already cut grows
    assert run(devices, [waiting("p", "1g.10gb", 2)]) == [("gpu-n1-0", "1g.10gb@0,1g.10gb@1")]


def test_a_pod_a_free_device_can_take_asks_nothing() -> None:
    devices = mig_gpu("n1", 0, ("3g.40gb", 0, 4, 3, 40960))
    assert run(devices, [waiting("p", "3g.40gb")]) == []


def test_pods_are_served_oldest_first_and_each_sees_the_last_one_s_device() -> None:
    devices = mig_gpu("n1", 0)
    pods = [waiting("late", "4g.40gb", created="2026-01-02T00:00:00Z"),
            waiting("early", "3g.40gb", created="2026-01-01T00:00:00Z")]
    assert run(devices, pods) == [("gpu-n1-0", "3g.40gb@4")]  # then no room for a 4g


def test_a_gpu_whose_agent_has_not_answered_is_left_alone() -> None:
    devices = mig_gpu("n1", 0) + mig_gpu("n1", 1)
    devices[0]["metadata"]["annotations"] = {contract.ANNOTATION_LAYOUT: "7g.80gb@0"}
    assert run(devices, [waiting("p", "1g.10gb")]) == [("gpu-n1-1", "1g.10gb@0")]
    devices[0]["status"]["mig"] = {"layout": "-", "requested": "7g.80gb@0", "state": "Refused"}
    assert run(devices, [waiting("p", "1g.10gb")]) == [("gpu-n1-0", "1g.10gb@0")]


def test_a_gpu_with_a_held_device_only_grows() -> None:
    devices = mig_gpu("n1", 0, ("4g.40gb", 0, 4, 4, 40960), ("3g.40gb", 4, 4, 3, 40960))
    held = placed_pod("busy", "team-b", "n1", (Slice("MIG-n1-0-3g.40gb@4", 1, 40960, 100,
                                                     "main"),), exclusive=True)
    assert run(devices, [held, waiting("p", "7g.80gb")]) == []
    assert run(devices, [waiting("p", "7g.80gb")]) == [("gpu-n1-0", "7g.80gb@0")]


@pytest.fixture
def api() -> Iterator[tuple[FakeApiServer, ControllerApi]]:
    with FakeApiServer() as fake:
        client = ControllerApi.open(server=fake.url)
        yield fake, client
        client.close()


def test_the_planner_writes_its_asks_on_the_gpudevices(
        api: tuple[FakeApiServer, ControllerApi]) -> None:
    fake, client = api
    devices = mig_gpu("n1", 0)
    for d in devices:
        fake.seed("gpudevices", d)
    pods = [waiting("p", "2g.20gb")]
    done = MigPlanner(client).round(listed(devices, pods), devices, pods)
    assert [(a.device, a.layout) for a in done] == [("gpu-n1-0", "2g.20gb@0")]
    notes = fake.get("gpudevices", "gpu-n1-0")["metadata"]["annotations"]
    assert notes[contract.ANNOTATION_LAYOUT] == "2g.20gb@0"
    assert notes[contract.ANNOTATION_REASON].startswith(
        "pod uid-p asks 1 MIG device 2g.20gb and no GPU offers them")


def test_a_gpu_grown_beside_a_held_device_keeps_that_device_and_its_pod() -> None:
    devices = mig_gpu("n1", 0, ("1g.10gb", 0, 1, 1, 10240))
    held = placed_pod("busy", "team-b", "n1", (Slice("MIG-n1-0-1g.10gb@0", 1, 10240, 100,
                                                     "main"),), exclusive=True)
    pods = [held, waiting("p", "1g.10gb", created="2026-01-01T00:00:00Z"),
            waiting("q", "2g.20gb", created="2026-01-02T00:00:00Z")]
    # the second plan on the same round sees the first's layout with the held device in it
    assert run(devices, pods) == [("gpu-n1-0", "1g.10gb@0,1g.10gb@1")]
