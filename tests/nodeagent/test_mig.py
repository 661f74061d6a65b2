"""MIG on the node: fake GPU files with MIG devices, the units the agent serves, the
repartitions it makes (and refuses), and the GPUDevices, logical devices and Events."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract import mig as contract
from gpupool.core import mig as core_mig
from gpupool.core.errors import InvalidInput
from gpupool.core.mig import MigDevice, MigMode
from gpupool.kube.api import KubeApi
from gpupool.nodeagent import mig
from gpupool.nodeagent.agent import AgentConfig, Guards, NodeAgent
from gpupool.nodeagent.fakegpus import FakeGpuBackend, load_file
from gpupool.nodeagent.fakemig import FakeMigDriver, device_uuid
from gpupool.nodeagent.gpu import GpuInfo
from gpupool.nodeagent.inventory import device_name, device_spec
from gpupool.nodeagent.kubeview import KubeEvents, KubeInventory, KubePods
from gpupool.nodeagent.logical import LogicalPool, Split
from gpupool.nodeagent.roster import GpuRoster

from .builders import NODE, uuid_of, wait_for

GPU0, GPU1 = uuid_of(0), uuid_of(1)


def board(path: Path, mig0: dict[str, Any] | None, model: str = "A100-SXM4-80GB",
          memory: int = 81920) -> Path:
    gpus: list[dict[str, Any]] = [
        {"uuid": GPU0, "model": model, "memoryMiB": memory, "labels": {"tier": "gold"}},
        {"uuid": GPU1, "model": model, "memoryMiB": memory, "index": 1}]
    if mig0 is not None:
        gpus[0]["mig"] = mig0
    path.write_text(yaml.safe_dump({"gpus": gpus}, sort_keys=False))
    return path


# -- the fake file and the units -----------------------------------------------------------
def test_a_fake_gpu_with_a_mig_key_is_in_mig_mode_with_its_devices(tmp_path: Path) -> None:
    path = board(tmp_path / "g.yaml", {"devices": [
        {"profile": "3g.40gb", "start": 4, "smCount": 42},
        {"profile": "1g.10gb", "start": 0, "uuid": "MIG-one", "memoryMiB": 9856}]})
    gpus = FakeGpuBackend(path).discover()
    assert isinstance(gpus[0].mig, MigMode) and gpus[1].mig is None
    units = mig.units(gpus)
    assert [u.uuid for u in units] == [GPU0, device_uuid(GPU0, "3g.40gb", 4), "MIG-one", GPU1]
    three, one = units[1], units[2]
    assert (three.memory_mib, three.index, three.labels) == (40960, 0, (("tier", "gold"),))
    assert three.mig == MigDevice(GPU0, "3g.40gb", 4, 4, 3, 1, 0)
    assert (one.memory_mib, one.to_core().mig_profile) == (9856, "1g.10gb")
    assert three.to_core().mig_profile == "3g.40gb" and gpus[0].to_core().in_mig_mode
    assert mig.shareable(units) == [units[3]]


@pytest.mark.parametrize(("mig0", "model", "message"), [
    ({"devices": [{"profile": "3g.40gb", "start": 2}]}, "A100-SXM4-80GB",
     "3g.40gb cannot start at memory slice 2"),
    ({"devices": [{"profile": "4g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 0}]},
     "A100-SXM4-80GB", "share memory slice 0"),
    ({"devices": [{"profile": "1g.5gb", "start": 0}]}, "A100-SXM4-80GB",
     "no MIG profile 1g.5gb"),
    ({"devices": []}, "T4", "has no MIG profiles gpupool knows"),
    ({"devices": [{"profile": "1g.10gb"}]}, "A100-SXM4-80GB", "start"),
], ids=["a bad start", "overlapping", "another GPU's profile", "a GPU without MIG",
        "no start"])
def test_a_fake_file_breaking_nvidias_rules_is_refused_naming_the_gpu(
        tmp_path: Path, mig0: dict[str, Any], model: str, message: str) -> None:
    with pytest.raises(InvalidInput) as err:
        load_file(board(tmp_path / "g.yaml", mig0, model, 16384 if model == "T4" else 81920))
    assert message in str(err.value)
    assert GPU0 in str(err.value) or "gpus[0].mig" in str(err.value)


def test_a_gpu_in_mig_mode_gets_no_logical_device_and_its_devices_do(tmp_path: Path) -> None:
    path = board(tmp_path / "g.yaml", {"devices": [{"profile": "7g.80gb", "start": 0}]})
    roster = GpuRoster(FakeGpuBackend(path).discover())
    pool = LogicalPool(list(roster.known.values()), Split(2))
    owners = {d.gpu_uuid for d in pool.devices()}
    assert owners == {device_uuid(GPU0, "7g.80gb", 0), GPU1}


def test_destroyed_mig_devices_leave_the_roster_but_a_vanished_gpu_stays(tmp_path: Path
                                                                        ) -> None:
    path = board(tmp_path / "g.yaml", {"devices": [{"profile": "7g.80gb", "start": 0}]})
    backend = FakeGpuBackend(path)
    roster = GpuRoster(backend.discover())
    backend.set_mig(GPU0, {"devices": [{"profile": "3g.40gb", "start": 4}]})
    roster.update(backend.discover())
    assert device_uuid(GPU0, "7g.80gb", 0) not in roster.known
    assert roster.known[device_uuid(GPU0, "3g.40gb", 4)].healthy
    backend.set_present(GPU0, False)
    roster.update(backend.discover())
    assert roster.known[device_uuid(GPU0, "3g.40gb", 4)].reason == "vanished"


def test_gpudevice_specs_say_mig_mode_and_each_device_s_place(tmp_path: Path) -> None:
    path = board(tmp_path / "g.yaml", {"devices": [{"profile": "3g.40gb", "start": 4}]})
    parent, device, plain = mig.units(FakeGpuBackend(path).discover())
    assert device_spec(NODE, parent)["mig"] == {"mode": "Enabled"}
    assert device_spec(NODE, device)["mig"] == {
        "parent": GPU0, "profile": "3g.40gb", "placement": {"start": 4, "size": 4},
        "slices": 3, "gpuInstance": 1, "computeInstance": 0}
    assert "mig" not in device_spec(NODE, plain)


# -- the fake driver --------------------------------------------------------------------------
def test_the_fake_driver_makes_and_destroys_devices_as_nvml_would(tmp_path: Path) -> None:
    path = board(tmp_path / "g.yaml", {"devices": [{"profile": "4g.40gb", "start": 0}]})
    backend = FakeGpuBackend(path)
    driver = FakeMigDriver(backend)
    driver.create(GPU0, "3g.40gb", 4)
    layout = mig.layout_of(driver.rescan()[0])
    assert [(d.profile, d.start, d.gpu_instance) for d in layout] == [
        ("4g.40gb", 0, 1), ("3g.40gb", 4, 2)]
    with pytest.raises(mig.MigError, match="the placement is taken"):
        driver.create(GPU0, "1g.10gb", 6)
    driver.destroy(GPU0, layout[0])
    assert [d.profile for d in mig.layout_of(backend.discover()[0])] == ["3g.40gb"]
    with pytest.raises(mig.MigError, match="is not in MIG mode"):
        driver.create(GPU1, "1g.10gb", 0)


@pytest.mark.parametrize("error", ["NoPermission", "GpuIsLost", "NotSupported"])
def test_injected_nvml_errors_fail_the_fake_driver_with_their_reason(tmp_path: Path,
                                                                      error: str) -> None:
    path = board(tmp_path / "g.yaml", {"devices": [], "error": error})
    driver = FakeMigDriver(FakeGpuBackend(path))
    with pytest.raises(mig.MigError, match="FAKE NVML on GPU") as err:
        driver.create(GPU0, "1g.10gb", 0)
    assert {"NoPermission": "privilege", "GpuIsLost": "lost",
            "NotSupported": "does not support"}[error] in str(err.value)


# -- the repartitioner --------------------------------------------------------------------------
class Events:
    def __init__(self) -> None:
        self.said: list[tuple[str, str, str, bool]] = []

    def device_event(self, name: str, reason: str, message: str, warning: bool) -> None:
        self.said.append((name, reason, message, warning))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def asked(layout: str, uuid: str = GPU0) -> list[dict[str, Any]]:
    return [{"metadata": {"name": device_name(uuid), "annotations": {
        contract.ANNOTATION_LAYOUT: layout, contract.ANNOTATION_REASON: "pod p waits"}},
        "spec": {"uuid": uuid}}]


def repartitioner(tmp_path: Path, mig0: dict[str, Any], users: dict[str, list[str]] | None = None
                  ) -> tuple[mig.Repartitioner, FakeMigDriver, Events, Clock]:
    backend = FakeGpuBackend(board(tmp_path / "g.yaml", mig0))
    driver = FakeMigDriver(backend)
    events, clock = Events(), Clock()
    holders = users or {}
    r = mig.Repartitioner(NODE, driver, lambda u: holders.get(u, []) + driver.processes(u),
                          events, lambda: datetime(2026, 1, 1, tzinfo=UTC), clock, 60.0)
    return r, driver, events, clock


def physical(driver: FakeMigDriver) -> list[GpuInfo]:
    return list(driver.rescan())


def test_an_asked_layout_is_made_recorded_and_not_made_twice(tmp_path: Path) -> None:
    r, driver, events, _ = repartitioner(tmp_path, {"devices": [
        {"profile": "1g.10gb", "start": 0}, {"profile": "1g.10gb", "start": 1}]})
    assert r.step(physical(driver), asked("1g.10gb@0,3g.40gb@4"))
    gpu = physical(driver)[0]
    assert core_mig.describe_layout(mig.layout_of(gpu)) == "1g.10gb@0,3g.40gb@4"
    assert mig.status(gpu, r) == {
        "layout": "1g.10gb@0,3g.40gb@4", "requested": "1g.10gb@0,3g.40gb@4",
        "state": "Applied", "message": "1g.10gb@0,1g.10gb@1 -> 1g.10gb@0,3g.40gb@4: pod p waits",
        "changedTime": "2026-01-01T00:00:00Z"}
    assert events.said == [(device_name(GPU0), mig.EVENT_DONE, f"GPU 0 ({GPU0}): "
                            "1g.10gb@0,1g.10gb@1 -> 1g.10gb@0,3g.40gb@4: pod p waits", False)]
    assert not r.step(physical(driver), asked("1g.10gb@0,3g.40gb@4"))
    assert len(events.said) == 1


def test_a_device_with_a_pod_or_a_process_is_never_destroyed(tmp_path: Path) -> None:
    kept = device_uuid(GPU0, "1g.10gb", 1)
    r, driver, events, _ = repartitioner(tmp_path, {"devices": [
        {"profile": "1g.10gb", "start": 0, "processes": [{"pid": 4242}]},
        {"profile": "1g.10gb", "start": 1}]}, {kept: ["pod team-a/train"]})
    assert not r.step(physical(driver), asked("4g.40gb@0"))
    assert core_mig.describe_layout(mig.layout_of(physical(driver)[0])) == "1g.10gb@0,1g.10gb@1"
    (_, reason, message, warning), = events.said
    assert reason == mig.EVENT_REFUSED and warning
    assert "MIG devices in use would be destroyed: 1g.10gb@0 (process 4242); 1g.10gb@1 " \
           "(pod team-a/train)" in message
    assert not r.step(physical(driver), asked("4g.40gb@0"))
    assert len(events.said) == 1  # a refusal is said once, and looked at again


def test_a_refusal_is_lifted_once_the_client_has_gone(tmp_path: Path) -> None:
    holders: dict[str, list[str]] = {device_uuid(GPU0, "7g.80gb", 0): ["pod a/b"]}
    r, driver, events, _ = repartitioner(tmp_path, {"devices": [
        {"profile": "7g.80gb", "start": 0}]}, holders)
    assert not r.step(physical(driver), asked("3g.40gb@0,3g.40gb@4"))
    holders.clear()
    assert r.step(physical(driver), asked("3g.40gb@0,3g.40gb@4"))
    assert [e[1] for e in events.said] == [mig.EVENT_REFUSED, mig.EVENT_DONE]


def test_at_most_one_change_per_interval_on_a_node(tmp_path: Path) -> None:
    r, driver, _, clock = repartitioner(tmp_path, {"devices": []})
    both = [*asked("7g.80gb@0"), *asked("7g.80gb@0", GPU1)]
    backend = driver.backend
    backend.set_mig(GPU1, {"devices": []})
    assert r.step(physical(driver), both)
    assert not r.step(physical(driver), both)  # GPU 1 waits for the interval
    assert [d.profile for d in mig.layout_of(physical(driver)[1])] == []
    clock.now += 61
    assert r.step(physical(driver), both)
    assert [d.profile for d in mig.layout_of(physical(driver)[1])] == ["7g.80gb"]


@pytest.mark.parametrize(("layout", "message"), [
    ("4g.40gb@0,3g.40gb@0", "share memory slice 0"),
    ("3g.40gb@2", "3g.40gb cannot start at memory slice 2"),
    ("big@0", "no MIG profile big"),
], ids=["overlapping", "a bad start", "not a profile"])
def test_a_layout_nvidia_forbids_is_refused_with_the_rule(tmp_path: Path, layout: str,
                                                          message: str) -> None:
    r, driver, events, _ = repartitioner(tmp_path, {"devices": []})
    assert not r.step(physical(driver), asked(layout))
    assert events.said[0][1] == mig.EVENT_REFUSED and message in events.said[0][2]


def test_a_gpu_not_in_mig_mode_is_not_switched(tmp_path: Path) -> None:
    r, driver, events, _ = repartitioner(tmp_path, {"devices": []})
    assert not r.step(physical(driver), asked("7g.80gb@0", GPU1))
    assert "is not in MIG mode (gpupool does not switch MIG mode" in events.said[0][2]


def test_a_driver_failure_is_recorded_as_failed(tmp_path: Path) -> None:
    r, driver, events, _ = repartitioner(tmp_path, {"devices": [], "error": "NoPermission"})
    assert r.step(physical(driver), asked("7g.80gb@0"))
    assert events.said[0][1] == mig.EVENT_FAILED
    assert "lacks the privilege" in events.said[0][2]
    assert mig.status(physical(driver)[0], r)["state"] == "Failed"


# -- the agent, end to end -----------------------------------------------------------------------
def test_the_agent_publishes_mig_devices_and_makes_an_asked_layout(
        short_dir: Path, apiserver: FakeApiServer) -> None:
    path = board(short_dir / "gpus.yaml", {"devices": [{"profile": "7g.80gb", "start": 0}]})
    api = KubeApi.connect(server=apiserver.url)
    backend = FakeGpuBackend(path, poll_s=0.02)
    config = AgentConfig(NODE, short_dir / "kubelet", Split(1), heartbeat_s=0.1, watch_s=0.02,
                         decide_unscheduled=True, monitor_s=3600.0, mig_interval_s=0.0)
    agent = NodeAgent(config, backend, KubePods(api), KubeInventory(api.fork()),
                      guards=Guards(device_events=KubeEvents(api, NODE)),
                      mig_driver=FakeMigDriver(backend))
    agent.start()
    try:
        old = device_name(device_uuid(GPU0, "7g.80gb", 0))
        wait_for(lambda: old in objects(apiserver))
        assert objects(apiserver)[device_name(GPU0)]["spec"]["mig"] == {"mode": "Enabled"}
        assert objects(apiserver)[old]["spec"]["mig"]["profile"] == "7g.80gb"
        apiserver.patch("gpudevices", device_name(GPU0), {"metadata": {"annotations": {
            contract.ANNOTATION_LAYOUT: "3g.40gb@0,3g.40gb@4"}}})
        new = [device_name(device_uuid(GPU0, "3g.40gb", s)) for s in (0, 4)]
        wait_for(lambda: all(n in objects(apiserver) for n in new)
                 and old not in objects(apiserver))
        wait_for(lambda: objects(apiserver)[device_name(GPU0)]["status"].get("mig", {}).get(
            "state") == "Applied")
        status = objects(apiserver)[device_name(GPU0)]["status"]["mig"]
        assert status["layout"] == "3g.40gb@0,3g.40gb@4"
        wait_for(lambda: any(e.get("reason") == mig.EVENT_DONE
                             for e in apiserver.objects("events")))
        event = next(e for e in apiserver.objects("events") if e["reason"] == mig.EVENT_DONE)
        assert event["involvedObject"]["kind"] == "GPUDevice"
        assert event["metadata"]["namespace"] == "default"
        assert sorted(d.gpu_uuid for d in agent.pool.devices()) == sorted(
            [device_uuid(GPU0, "3g.40gb", 0), device_uuid(GPU0, "3g.40gb", 4), GPU1])
    finally:
        agent.stop()
        api.close()
        time.sleep(0)


def objects(api: FakeApiServer) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in api.objects("gpudevices")}


def test_allocate_serves_a_decided_mig_device_and_refuses_its_gpu(
        kubelet: Any, make_agent: Any, apiserver: FakeApiServer) -> None:
    import random

    import grpc

    from .builders import decision, pod
    from .kubelet_standin import runtime_gpus
    agent = make_agent(gpus=2, split=1, memory_mib=81920)
    agent.backend.set_mig(GPU0, {"devices": [{"profile": "3g.40gb", "start": 4}]})
    kubelet.wait_registrations(1)
    kubelet.wait_update(lambda d: len(d) == 2)  # GPU 1 and the MIG device; GPU 0 none
    device = device_uuid(GPU0, "3g.40gb", 4)
    p = pod("p1", [("main", 1, 0, 0)], ann=decision(
        "p1", [(device, 1, 40960, 100, "main")], exclusive=True))  # after GPU 0, by uuid
    apiserver.seed("pods", p)
    got = kubelet.admit(p, random.Random(3))
    assert runtime_gpus(got, "main") == [device]
    assert got.envs["main"]["GPUPOOL_MODE"] == "exclusive"
    whole = pod("p2", [("main", 1, 0, 0)], ann=decision(
        "p2", [(GPU0, 0, 81920, 100, "main")], exclusive=True))
    apiserver.seed("pods", whole)
    with pytest.raises(grpc.RpcError) as err:
        kubelet.admit(whole, random.Random(4))
    assert "is in MIG mode" in str(err.value.details())
