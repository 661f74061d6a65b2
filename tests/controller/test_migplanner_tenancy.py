"""MIG on demand within tenancy: the controller repartitions a GPU only for a pod the
extender would then place there (its TenantQuota and group quota with the MIG devices
counted, its GPUPermissions, its group), only on GPUs it may use, and only for as many of
a tenant's waiting pods as its quota holds."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract import names
from gpupool.controller import migplanner
from gpupool.controller.loop import Controller
from gpupool.controller.migplanner import MigPlanner, Round, plan_round
from gpupool.controller.observed import Tenancy, observe
from gpupool.core.allocation import Slice
from gpupool.core.errors import InvalidInput
from gpupool.core.model import freeze_labels
from gpupool.kube.controller_ops import ControllerApi
from tests.waiting import wait_for

from .builders import device, group, placed_pod, slices, verify
from .test_migplanner import api, mig_gpu, waiting

__all__ = ["api"]  # the fake API server and a client on it, a fixture


def quota(name: str, *namespaces: str, **limits: int) -> dict[str, Any]:
    return {"metadata": {"name": name},
            "spec": {"namespaces": list(namespaces or (name,)), "limits": limits}}


def permission(name: str, tenant: str, nodes: dict[str, str] | None = None,
               gpus: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"tenants": [tenant]}
    if nodes is not None:
        spec["nodeSelector"] = {"matchLabels": nodes}
    if gpus is not None:
        spec["gpuSelector"] = {"matchLabels": gpus}
    return {"metadata": {"name": name}, "spec": spec}


def in_ns(pod: dict[str, Any], ns: str) -> dict[str, Any]:
    pod["metadata"]["namespace"] = ns
    pod["metadata"]["uid"] = f"uid-{ns}-{pod['metadata']['name']}"
    return pod


def labelled(pod: dict[str, Any], group_name: str) -> dict[str, Any]:
    pod["metadata"]["labels"] = {names.LABEL_GROUP: group_name}
    return pod


def decide(devices: list[dict[str, Any]], pods: list[dict[str, Any]], *,
           quotas: tuple[dict[str, Any], ...] = (),
           permissions: tuple[dict[str, Any], ...] = (),
           groups: tuple[dict[str, Any], ...] = (),
           node_labels: dict[str, dict[str, str]] | None = None) -> Round:
    tenancy = Tenancy(quotas, permissions,
                      {n: freeze_labels(v) for n, v in (node_labels or {}).items()})
    observed = replace(observe(devices, [], list(groups), pods), tenancy=tenancy)
    return plan_round(observed, devices, pods)


def asked(r: Round) -> list[tuple[str, str]]:
    return [(a.device, a.layout) for a in r.asks]


def refused(r: Round) -> list[tuple[str, str]]:
    """(pod name, the refusing check) of each pod skipped."""
    return [(s.name, s.check) for s in r.skipped]


# -- quota -------------------------------------------------------------------------------------
def test_a_pod_over_its_tenant_quota_gets_no_repartition() -> None:
    devices = [*mig_gpu("n1", 0), device("n2", 0)]
    held = placed_pod("busy", "team-a", "n2", slices("n2", (0, 80 * 1024, 100)), exclusive=True)
    r = decide(devices, [held, waiting("p", "1g.10gb")], quotas=(quota("team-a", gpus=1),))
    assert asked(r) == []
    assert refused(r) == [("p", "quota")]
    assert "quota of tenant team-a exceeded: 1 GPUs asked, 1 of 1 in use" in r.skipped[0].reason
    # without the quota the same pod is served
    assert asked(decide(devices, [held, waiting("p", "1g.10gb")])) == [
        ("gpu-n1-0", "1g.10gb@0")]


def test_the_mig_devices_memory_counts_against_the_quota_before_they_exist() -> None:
    devices = mig_gpu("n1", 0)  # no device yet: the 3g's 40 GiB still counts
    limit = (quota("team-a", memoryMiB=30 * 1024),)
    r = decide(devices, [waiting("p", "3g.40gb")], quotas=limit)
    assert asked(r) == [] and refused(r) == [("p", "quota")]
    assert "40960 MiB of GPU memory asked" in r.skipped[0].reason
    assert asked(decide(devices, [waiting("p", "2g.20gb")], quotas=limit)) == [
        ("gpu-n1-0", "2g.20gb@0")]


def test_of_two_waiting_pods_with_room_in_the_quota_for_one_only_one_is_planned_for() -> None:
    devices = mig_gpu("n1", 0) + mig_gpu("n1", 1)
    pods = [waiting("first", "3g.40gb", created="2026-01-01T00:00:00Z"),
            waiting("second", "3g.40gb", created="2026-01-02T00:00:00Z")]
    r = decide(devices, pods, quotas=(quota("team-a", gpus=1),))
    assert len(r.asks) == 1
    assert refused(r) == [("second", "quota")]
    # with room for both, both are planned for (each sees the other's device as taken)
    assert len(decide(devices, pods, quotas=(quota("team-a", gpus=2),)).asks) == 2


def test_a_pod_a_free_device_takes_uses_the_quota_the_next_pod_would_need() -> None:
    devices = mig_gpu("n1", 0, ("1g.10gb", 0, 1, 1, 10240)) + mig_gpu("n1", 1)
    pods = [waiting("fits", "1g.10gb", created="2026-01-01T00:00:00Z"),
            waiting("later", "1g.10gb", created="2026-01-02T00:00:00Z")]
    r = decide(devices, pods, quotas=(quota("team-a", gpus=1),))
    assert asked(r) == [] and refused(r) == [("later", "quota")]
    # without a quota the later pod gets a device of its own (the free one is the first's)
    assert len(decide(devices, pods).asks) == 1


def test_a_pod_of_another_tenant_with_quota_left_is_still_served() -> None:
    devices = mig_gpu("n1", 0)
    pods = [waiting("a", "3g.40gb", created="2026-01-01T00:00:00Z"),
            in_ns(waiting("b", "3g.40gb", created="2026-01-02T00:00:00Z"), "team-b")]
    r = decide(devices, pods, quotas=(quota("team-a", gpus=0), quota("team-b", gpus=1)))
    assert refused(r) == [("a", "quota")]
    assert [a.reason.split(" asks")[0] for a in r.asks] == ["pod uid-team-b-b"]


def test_a_group_quota_refuses_as_the_tenant_quota_does() -> None:
    devices = mig_gpu("n1", 0)
    g = group("small", nodes=["n1"], quota={"gpus": 0})
    r = decide(devices, [labelled(waiting("p", "1g.10gb"), "small")], groups=(g,))
    assert asked(r) == [] and refused(r) == [("p", "quota")]
    assert "quota of group small exceeded" in r.skipped[0].reason


# -- where the pod may go ----------------------------------------------------------------------
def test_a_pod_whose_permissions_allow_some_nodes_gets_a_gpu_there_only() -> None:
    devices = mig_gpu("n1", 0, ("1g.10gb", 0, 1, 1, 10240)) + mig_gpu("n2", 0)
    held = placed_pod("busy", "team-b", "n1", (Slice("MIG-n1-0-1g.10gb@0", 1, 10240, 100,
                                                     "main"),), exclusive=True)
    pods = [held, waiting("p", "1g.10gb")]
    assert asked(decide(devices, pods)) == [("gpu-n1-0", "1g.10gb@0,1g.10gb@1")]  # packing
    confined = decide(devices, pods, permissions=(permission("b-only", "team-a", {"pool": "b"}),),
                      node_labels={"n1": {"pool": "a"}, "n2": {"pool": "b"}})
    assert asked(confined) == [("gpu-n2-0", "1g.10gb@0")]


def test_a_pod_whose_permissions_allow_some_gpus_gets_one_of_those() -> None:
    devices = mig_gpu("n1", 0) + mig_gpu("n1", 1)
    devices[0]["spec"]["labels"] = {"tier": "gold"}
    devices[1]["spec"]["labels"] = {"tier": "basic"}
    pods = [waiting("p", "1g.10gb")]
    assert asked(decide(devices, pods)) == [("gpu-n1-0", "1g.10gb@0")]
    basic = (permission("basic", "team-a", gpus={"tier": "basic"}),)
    assert asked(decide(devices, pods, permissions=basic)) == [("gpu-n1-1", "1g.10gb@0")]


def test_a_pod_whose_permissions_allow_no_gpu_of_its_profile_is_skipped() -> None:
    devices = mig_gpu("n1", 0)
    r = decide(devices, [waiting("p", "1g.10gb")],
               permissions=(permission("elsewhere", "team-a", {"pool": "b"}),),
               node_labels={"n1": {"pool": "a"}})
    assert asked(r) == [] and refused(r) == [("p", "group")]
    assert "under its permissions" in r.skipped[0].reason


def test_a_pod_of_a_group_gets_a_gpu_of_its_group_only() -> None:
    devices = mig_gpu("n1", 0, ("1g.10gb", 0, 1, 1, 10240)) + mig_gpu("n2", 0)
    held = placed_pod("busy", "team-b", "n1", (Slice("MIG-n1-0-1g.10gb@0", 1, 10240, 100,
                                                     "main"),), exclusive=True)
    groups = (group("on-n2", nodes=["n2"]), group("on-n1", nodes=["n1"]))
    pods = [held, labelled(waiting("p", "1g.10gb"), "on-n2")]
    assert asked(decide(devices, pods, groups=groups)) == [("gpu-n2-0", "1g.10gb@0")]
    r = decide(devices, [held, labelled(waiting("p", "1g.10gb"), "missing")], groups=groups)
    assert asked(r) == [] and refused(r) == [("p", "group")]


# -- objects that cannot be read, or are not known yet -----------------------------------------
def test_a_broken_tenant_quota_is_not_enforced_as_the_extender_does_not_enforce_it() -> None:
    broken = quota("team-a", gpus=0)
    broken["spec"]["limitz"] = {"gpus": 0}
    assert asked(decide(mig_gpu("n1", 0), [waiting("p", "1g.10gb")], quotas=(broken,))) == [
        ("gpu-n1-0", "1g.10gb@0")]


def test_a_broken_permission_whose_tenants_can_be_read_permits_them_nothing() -> None:
    broken = permission("p", "team-a")
    broken["spec"]["nodeSelector"] = "pool=b"
    r = decide(mig_gpu("n1", 0), [waiting("p", "1g.10gb")], permissions=(broken,))
    assert asked(r) == [] and refused(r) == [("p", "group")]


def test_a_namespace_no_quota_names_is_not_limited() -> None:
    r = decide(mig_gpu("n1", 0), [waiting("p", "1g.10gb")], quotas=(quota("team-b", gpus=0),))
    assert asked(r) == [("gpu-n1-0", "1g.10gb@0")]


def test_nothing_is_planned_while_quotas_and_permissions_are_not_listed() -> None:
    devices = mig_gpu("n1", 0)
    pods = [waiting("p", "1g.10gb")]
    r = plan_round(observe(devices, [], [], pods), devices, pods)
    assert r.asks == () and "not listed yet" in r.waiting_for
    assert plan_round(observe(devices, [], [], []), devices, []).waiting_for == ""


# -- what the planner tells --------------------------------------------------------------------
def test_a_skipped_pod_gets_one_event_and_is_counted_once(
        api: tuple[FakeApiServer, ControllerApi]) -> None:
    fake, client = api
    devices = mig_gpu("n1", 0)
    for d in devices:
        fake.seed("gpudevices", d)
    pods = [waiting("p", "1g.10gb")]
    observed = replace(observe(devices, [], [], pods),
                       tenancy=Tenancy((quota("team-a", gpus=0),)))
    planner = MigPlanner(client)
    for _ in range(3):
        assert planner.round(observed, devices, pods) == []
    events = fake.objects("events")
    assert [(e["reason"], e["involvedObject"]["name"]) for e in events] == [
        ("GpupoolMigRepartitionSkipped", "p")]
    assert "quota of tenant team-a exceeded" in events[0]["message"]
    assert planner.skipped == {"quota": 1}
    assert not fake.get("gpudevices", "gpu-n1-0")["metadata"].get("annotations")


def test_a_free_device_of_another_group_does_not_stop_a_repartition_in_the_pod_s_own() -> None:
    devices = mig_gpu("n1", 0, ("1g.10gb", 0, 1, 1, 10240)) + mig_gpu("n2", 0)
    groups = (group("on-n1", nodes=["n1"]), group("on-n2", nodes=["n2"]))
    pods = [labelled(waiting("p", "1g.10gb"), "on-n2")]
    assert asked(decide(devices, pods, groups=groups)) == [("gpu-n2-0", "1g.10gb@0")]


def test_a_round_the_core_cannot_plan_asks_nothing_and_the_loop_goes_on(
        api: tuple[FakeApiServer, ControllerApi], monkeypatch: pytest.MonkeyPatch) -> None:
    _, client = api

    def broken(*_: Any, **__: Any) -> Round:
        raise InvalidInput("a layout the scratch state refuses")

    monkeypatch.setattr(migplanner, "plan_round", broken)
    devices = mig_gpu("n1", 0)
    pods = [waiting("p", "1g.10gb")]
    assert MigPlanner(client).round(replace(observe(devices, [], [], pods), tenancy=Tenancy()),
                                    devices, pods) == []


# -- through the controller's loop ------------------------------------------------------------
def run_loop(fake: FakeApiServer, client: ControllerApi, done: Callable[[], bool]) -> None:
    stop = threading.Event()
    controller = Controller(client, verify=verify, mig=MigPlanner(client))
    thread = threading.Thread(target=controller.run, args=(stop, 60.0, None, 1))
    thread.start()
    try:
        assert wait_for(done)
    finally:
        stop.set()
        thread.join(30)


def test_the_loop_gives_the_planner_the_listed_quotas_and_plans_for_a_pod_within_them(
        api: tuple[FakeApiServer, ControllerApi]) -> None:
    fake, client = api
    for d in mig_gpu("n1", 0):
        fake.seed("gpudevices", d)
    fake.seed("tenantquotas", quota("team-a", gpuMemory=1 << 20))
    fake.seed("pods", waiting("p", "1g.10gb"))
    run_loop(fake, client, lambda: bool(
        fake.get("gpudevices", "gpu-n1-0")["metadata"].get("annotations")))


def test_the_loop_plans_nothing_for_a_pod_the_listed_quota_refuses(
        api: tuple[FakeApiServer, ControllerApi]) -> None:
    fake, client = api
    for d in mig_gpu("n1", 0):
        fake.seed("gpudevices", d)
    fake.seed("tenantquotas", quota("team-a", gpus=0))
    fake.seed("pods", waiting("p", "1g.10gb"))
    run_loop(fake, client, lambda: any(
        e["reason"] == "GpupoolMigRepartitionSkipped" for e in fake.objects("events")))
    assert not fake.get("gpudevices", "gpu-n1-0")["metadata"].get("annotations")
