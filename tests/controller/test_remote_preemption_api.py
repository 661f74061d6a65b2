"""Preemption for remote slices through the API: the controller's real client against the
FAKE API server evicts pods of strictly lower priority on a GPU node so that a pending
remote-required pod's slice fits, with Events, the Eviction API (a budget's 429 tried
again later, never forced), the serving tiers, one freed GPU counted once, nothing sent
once the term ended, broken pods skipped; the calls it needs are what the chart grants."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract import names
from gpupool.contract.podspec_request import pod_request
from gpupool.controller.catalogue import catalogue_of
from gpupool.controller.loop import Controller, TenancyWorld
from gpupool.controller.metrics import ControllerMetrics
from gpupool.controller.remotepreempt import (
    PreemptionConfig,
    RemotePlanner,
    RoundPlan,
    preemption_state,
)
from gpupool.controller.remotepreemptor import RemotePreemptor
from gpupool.core.fit import feasible
from gpupool.core.serving import ZONE_LABEL, slice_of
from gpupool.kube.controller_ops import ControllerApi
from tests.rbac_grants import grants, manifest, needed, refused, writes
from tests.waiting import wait_for

from .builders import GIB, device, placed_pod, slices, verify

REFUSED_AT = "2026-01-01T00:00:00Z"
LATER = 1767225600.0 + 3600  # an hour after REFUSED_AT
HOSTNAME = "kubernetes.io/hostname"


class Clock:
    def __init__(self) -> None:
        self.now = LATER

    def __call__(self) -> float:
        self.now += 1e-6  # each Event a name of its own
        return self.now


def node(name: str, zone: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {ZONE_LABEL: zone, HOSTNAME: name}}}


def victim(name: str, gpu_node: str, mib: int, priority: Any, **extra: Any) -> dict[str, Any]:
    pod = placed_pod(name, "low", gpu_node, slices(gpu_node, (0, mib, 10)))
    pod["spec"]["priority"] = priority
    pod["metadata"]["labels"].update(extra.pop("labels", {}))
    return pod


def waiting(name: str, mib: int, priority: Any = 1000, **spec: Any) -> dict[str, Any]:
    """A remote-required pod as admitted (its count renamed), refused by kube-scheduler."""
    return {"metadata": {"name": name, "namespace": "lab", "uid": f"uid-lab-{name}",
                         "creationTimestamp": "2026-01-01T00:00:00Z",
                         "annotations": {names.ANNOTATION_PLACEMENT: "remote-required"}},
            "spec": {"priority": priority, "containers": [{
                "name": "main", "image": "train", "resources": {"limits": {
                    names.RESOURCE_REMOTE_GPU: "1", names.RESOURCE_MEMORY: str(mib),
                    names.RESOURCE_CORE: "10"}}}], **spec},
            "status": {"phase": "Pending", "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "lastTransitionTime": REFUSED_AT,
                "message": "0/4 nodes are available: gpupool: no room"}]}}


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    """g1, g2 (zone a) and g3 (zone b), one 80 GiB GPU each; c1, zone a, without GPUs."""
    with FakeApiServer() as server:
        for n, zone in (("g1", "a"), ("g2", "a"), ("g3", "b"), ("c1", "a")):
            server.seed("nodes", node(n, zone))
        for n in ("g1", "g2", "g3"):
            server.seed("gpudevices", device(n, 0))
        yield server


class World:
    """The controller's real client and a preemptor, one round at a time."""

    def __init__(self, fake: FakeApiServer, **config: Any):
        self.fake = fake
        self.api = ControllerApi.open(server=fake.url)
        self.clock = Clock()
        self.metrics = ControllerMetrics()
        self.planner = RemotePlanner(PreemptionConfig(**config))
        self.preemptor = RemotePreemptor(self.api, self.planner, self.metrics.remote_preempted,
                                         self.clock)

    def round(self, ended: threading.Event | None = None) -> RoundPlan:
        controller = Controller(self.api, verify=verify)
        observed = controller.list_world()
        labels, permissions, quotas, _ = TenancyWorld.listed(self.api).snapshot()
        return self.preemptor.round(observed, controller.listed_pods, labels,
                                    catalogue_of(observed, quotas, permissions),
                                    ended)

    def fits(self, pod_name: str) -> bool:
        """Whether the slice of pending pod ``pod_name`` has room now."""
        observed = Controller(self.api, verify=verify).list_world()
        pod = self.fake.get("pods", pod_name, "lab")
        assert pod is not None
        return bool(feasible(preemption_state(observed), slice_of(pod_request(pod)))[0].any())

    def count(self, outcome: str) -> float:
        value: float = self.metrics.remote_preemption.labels(outcome)._value.get()
        return value

    def close(self) -> None:
        self.api.close()


def fill(fake: FakeApiServer, *gpu_nodes: str) -> None:
    """Fill the GPUs of ``gpu_nodes`` with pods nobody may preempt (priority 5000)."""
    for n in gpu_nodes:
        fake.seed("pods", victim(f"full-{n}", n, 80 * GIB, 5000))


def pods(fake: FakeApiServer) -> set[str]:
    return {p["metadata"]["name"] for p in fake.objects("pods")
            if not p["metadata"]["name"].startswith("full-")}


def events(fake: FakeApiServer) -> list[tuple[str, str]]:
    return sorted((e["reason"], e["involvedObject"]["name"]) for e in fake.objects("events"))


def evictions(fake: FakeApiServer) -> list[str]:
    return [p for m, p in fake.requests if m == "POST" and p.endswith("/eviction")]


def test_a_pod_of_higher_priority_gets_the_lowest_priority_pod_evicted_and_then_fits(
        fake: FakeApiServer) -> None:
    for pod in (victim("a", "g1", 40 * GIB, 1), victim("b", "g1", 40 * GIB, 5),
                victim("c", "g2", 80 * GIB, 10), victim("d", "g3", 80 * GIB, 10),
                waiting("big", 40 * GIB)):
        fake.seed("pods", pod)
    world = World(fake)
    try:
        assert not world.fits("big")
        plan = world.round()
        assert [(p.node, [v.pod for v in p.victims]) for p in plan.preemptions] == \
            [("g1", ["low/a"])]
        assert pods(fake) == {"b", "c", "d", "big"}
        assert world.fits("big")
        assert events(fake) == [("GpupoolRemotePreempted", "a"),
                                ("GpupoolRemotePreempting", "big")]
        message = next(e["message"] for e in fake.objects("events")
                       if e["involvedObject"]["name"] == "a")
        assert "lab/big (priority 1000, higher than this pod's 1)" in message
        assert world.count("evicted") == 1
        calls = needed(fake.requests)
    finally:
        world.close()
    rules = grants(manifest("controller", "rbac.yaml"), "gpupool-controller")
    assert refused(calls, rules) == set()
    assert {("", "pods/eviction"), ("", "events")} <= writes(calls)
    assert ("", "pods") not in writes(calls)  # evicted through the API server, never deleted


def test_pods_of_equal_or_higher_priority_are_never_victims(fake: FakeApiServer) -> None:
    for pod in (victim("same", "g1", 80 * GIB, 1000), victim("above", "g2", 80 * GIB, 2000),
                victim("gang", "g3", 80 * GIB, 1, labels={names.LABEL_GANG: "job"}),
                waiting("big", 40 * GIB)):
        fake.seed("pods", pod)
    world = World(fake)
    try:
        plan = world.round()
        world.round()  # told once per reason, not once per round
    finally:
        world.close()
    assert plan.preemptions == () and evictions(fake) == [] and events(fake) == []
    assert [s.pod for s in plan.skipped] == ["lab/big"]
    assert "no pods of lower priority" in plan.skipped[0].reason
    assert world.count("no-victims") == 1


def test_a_pod_that_never_preempts_waits(fake: FakeApiServer) -> None:
    fill(fake, "g2", "g3")
    fake.seed("pods", victim("a", "g1", 80 * GIB, 1))
    fake.seed("pods", waiting("big", 40 * GIB, preemptionPolicy="Never"))
    world = World(fake)
    try:
        plan = world.round()
    finally:
        world.close()
    assert evictions(fake) == [] and pods(fake) == {"a", "big"}
    assert [s.reason for s in plan.skipped] == ["its preemptionPolicy is Never"]


def test_a_pod_within_its_grace_period_waits_and_the_round_says_when_to_look_again(
        fake: FakeApiServer) -> None:
    fill(fake, "g2", "g3")
    fake.seed("pods", victim("a", "g1", 80 * GIB, 1))
    fake.seed("pods", waiting("big", 40 * GIB))
    world = World(fake, grace_s=7200.0)
    try:
        plan = world.round()
    finally:
        world.close()
    assert evictions(fake) == [] and plan.next_s == pytest.approx(LATER + 3600, abs=1)


def test_a_victim_a_disruption_budget_protects_is_tried_again_later_never_forced(
        fake: FakeApiServer) -> None:
    fill(fake, "g2", "g3")
    fake.seed("pods", victim("a", "g1", 80 * GIB, 1))
    fake.seed("pods", waiting("big", 40 * GIB))
    fake.fail_next("POST", "eviction", 429, "Cannot evict pod as it would violate the pod's "
                                            "disruption budget.")
    world = World(fake, retry_s=60.0)
    try:
        world.round()
        assert pods(fake) == {"a", "big"} and len(evictions(fake)) == 1
        assert world.count("blocked") == 1
        world.clock.now += 30
        world.round()  # within the retry time: not chosen, nothing sent
        assert len(evictions(fake)) == 1
        world.clock.now += 31
        world.round()
    finally:
        world.close()
    assert pods(fake) == {"big"} and len(evictions(fake)) == 2
    assert events(fake) == [("GpupoolRemotePreempted", "a"), ("GpupoolRemotePreempted", "a"),
                            ("GpupoolRemotePreempting", "big"),
                            ("GpupoolRemotePreempting", "big"),
                            ("GpupoolRemotePreemptionBlocked", "a")]
    assert (world.count("blocked"), world.count("evicted")) == (1, 1)


def test_two_pending_pods_never_count_one_freed_gpu_twice(fake: FakeApiServer) -> None:
    for pod in (victim("a", "g1", 80 * GIB, 1), victim("b", "g2", 80 * GIB, 2),
                victim("c", "g3", 80 * GIB, 2000),
                waiting("first", 60 * GIB, 1000), waiting("second", 60 * GIB, 1000)):
        fake.seed("pods", pod)
    fake.seed("pods", {**waiting("third", 60 * GIB, 1000)})
    world = World(fake)
    try:
        plan = world.round()
        assert {p.preemptor.name: p.node for p in plan.preemptions} == \
            {"first": "g1", "second": "g2"}
        assert [s.pod for s in plan.skipped] == ["lab/third"]  # c is of higher priority
        again = world.round()  # the room made is kept for its pods: nobody else counts it
    finally:
        world.close()
    assert pods(fake) == {"c", "first", "second", "third"} and len(evictions(fake)) == 2
    assert again.preemptions == () and [s.pod for s in again.skipped] == ["lab/third"]


def test_room_on_the_pods_own_node_comes_first_then_its_zone_then_any(
        fake: FakeApiServer) -> None:
    for pod in (victim("own", "g2", 80 * GIB, 7), victim("zone", "g1", 80 * GIB, 5),
                victim("far", "g3", 80 * GIB, 1),
                waiting("on-g2", 60 * GIB, 1000, nodeSelector={HOSTNAME: "g2"}),
                waiting("on-c1", 60 * GIB, 900, nodeSelector={HOSTNAME: "c1"}),
                waiting("anywhere", 60 * GIB, 800)):
        fake.seed("pods", pod)
    world = World(fake)
    try:
        plan = world.round()
    finally:
        world.close()
    assert [(p.preemptor.name, p.node, p.tier) for p in plan.preemptions] == [
        ("on-g2", "g2", "own node"),  # its own node, though others hold lower priorities
        ("on-c1", "g1", f"{ZONE_LABEL}=a"),  # c1 has no GPU: its zone before zone b
        ("anywhere", "g3", "own node")]  # may run anywhere: the lowest priority goes


def affinity(*terms: list[dict[str, Any]], fields: list[dict[str, Any]] | None = None
             ) -> dict[str, Any]:
    """``spec.affinity`` whose required node affinity has one term per ``terms`` (its
    matchExpressions), and a term of ``fields`` (matchFields) when given."""
    out: list[dict[str, Any]] = [{"matchExpressions": t} for t in terms]
    if fields is not None:
        out.append({"matchFields": fields})
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": out}}}


def test_required_node_affinity_says_where_the_pod_may_run_as_a_node_selector_does(
        fake: FakeApiServer) -> None:
    for pod in (victim("own", "g2", 80 * GIB, 7), victim("zone", "g1", 80 * GIB, 5),
                victim("far", "g3", 80 * GIB, 1),
                waiting("on-g2", 60 * GIB, 1000, affinity=affinity(
                    [{"key": HOSTNAME, "operator": "In", "values": ["g2"]}])),
                waiting("on-c1", 60 * GIB, 900, affinity=affinity(
                    [{"key": HOSTNAME, "operator": "NotIn", "values": ["g1", "g2", "g3"]},
                     {"key": ZONE_LABEL, "operator": "Exists"}])),
                waiting("anywhere", 60 * GIB, 800)):
        fake.seed("pods", pod)
    world = World(fake)
    try:
        plan = world.round()
    finally:
        world.close()
    assert [(p.preemptor.name, p.node, p.tier) for p in plan.preemptions] == [
        ("on-g2", "g2", "own node"),
        ("on-c1", "g1", f"{ZONE_LABEL}=a"),  # only c1 (no GPU) admits it: its zone first
        ("anywhere", "g3", "own node")]


def test_node_affinity_terms_are_any_of_and_narrow_a_node_selector(
        fake: FakeApiServer) -> None:
    """Terms are ORed (one by labels, one by the node's name through matchFields); a
    nodeSelector beside them must hold too: g3 is named but is not in zone a."""
    for pod in (victim("own", "g2", 80 * GIB, 7), victim("zone", "g1", 80 * GIB, 5),
                victim("far", "g3", 80 * GIB, 1),
                waiting("either", 60 * GIB, 1000, nodeSelector={ZONE_LABEL: "a"},
                        affinity=affinity(
                            [{"key": HOSTNAME, "operator": "In", "values": ["g2"]}],
                            fields=[{"key": "metadata.name", "operator": "In",
                                     "values": ["g3"]}]))):
        fake.seed("pods", pod)
    world = World(fake)
    try:
        plan = world.round()
    finally:
        world.close()
    assert [(p.preemptor.name, p.node, p.tier) for p in plan.preemptions] == [
        ("either", "g2", "own node")]  # g3 (priority 1) would be cheaper, but is not its own


def test_nothing_is_sent_once_the_term_has_ended(fake: FakeApiServer) -> None:
    fill(fake, "g3")
    fake.seed("pods", victim("a", "g1", 80 * GIB, 1))
    fake.seed("pods", victim("b", "g2", 80 * GIB, 1))
    fake.seed("pods", waiting("big", 40 * GIB))
    world = World(fake)
    ended = threading.Event()
    ended.set()
    try:
        plan = world.round(ended)
    finally:
        world.close()
    assert plan == RoundPlan()
    assert [m for m, _ in fake.requests if m != "GET"] == []
    assert pods(fake) == {"a", "b", "big"}


def test_broken_pods_are_skipped_with_a_reason_and_the_rest_still_preempts(
        fake: FakeApiServer) -> None:
    fill(fake, "g3")
    typo = waiting("typo", 40 * GIB)
    typo["metadata"]["annotations"][names.ANNOTATION_PLACEMENT] = "remote"
    lots = waiting("lots", 40 * GIB)
    lots["spec"]["containers"][0]["resources"]["limits"][names.RESOURCE_MEMORY] = "lots"
    for pod in (victim("a", "g1", 80 * GIB, 1), victim("b", "g2", 80 * GIB, 2), typo, lots,
                waiting("fine", 40 * GIB)):
        fake.seed("pods", pod)
    world = World(fake)
    try:
        plan = world.round()
    finally:
        world.close()
    assert {s.pod: s.invalid for s in plan.skipped} == {"lab/typo": True, "lab/lots": True}
    reasons = " | ".join(sorted(s.reason for s in plan.skipped))
    assert "must be one of local, remote-allowed, remote-required" in reasons
    assert "lots" in reasons
    assert [(p.preemptor.name, [v.name for v in p.victims]) for p in plan.preemptions] == \
        [("fine", ["a"])]
    assert world.count("invalid") == 2


def test_the_controller_loop_preempts_for_a_waiting_pod(fake: FakeApiServer) -> None:
    fill(fake, "g2", "g3")
    fake.seed("pods", victim("a", "g1", 80 * GIB, 1))
    fake.seed("pods", waiting("big", 40 * GIB))
    world = World(fake)
    stop = threading.Event()
    controller = Controller(world.api, verify=verify, preemptor=world.preemptor)
    thread = threading.Thread(target=controller.run, args=(stop, 60.0, None, 1))
    thread.start()
    try:
        assert wait_for(lambda: "a" not in pods(fake))
    finally:
        stop.set()
        thread.join(30)
        world.close()
    assert pods(fake) == {"big"} and world.count("evicted") == 1


def test_a_remote_required_gang_member_evicts_nobody(fake: FakeApiServer) -> None:
    """The extender refuses a gang with remote-required members: room made would serve
    nobody, and would be made again after each hold expired."""
    fill(fake, "g2", "g3")
    fake.seed("pods", victim("a", "g1", 80 * GIB, 1))
    pod = waiting("member", 40 * GIB)
    pod["metadata"]["labels"] = {names.LABEL_GANG: "g"}
    fake.seed("pods", pod)
    world = World(fake)
    try:
        plan = world.round()
    finally:
        world.close()
    assert plan.preemptions == () and evictions(fake) == []
    assert [s.reason for s in plan.skipped] == [
        "evicting others would not help: a gang's members cannot have remote GPU slices"]
