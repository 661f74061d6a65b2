"""Preemption for gangs over the FAKE API server: a gang of high priority gets room for
all its members by evicting pods of lower priority (its holds written first, each standing
for the victims of its node), a victim gang goes whole or not at all, and nobody is
evicted when the room would still not suffice, when a budget forbids it, or when a member
may not preempt (docs/gangs.md; docs/design/preemption.md, "Room for a gang")."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.extender.preemption.plans import PreemptionSettings
from gpupool.extender.state.ledger import view_of
from tests.waiting import wait_for

from .builders import Replica, pod_obj, schedule, seed_cluster
from .test_gangs import GPU, answer_of, holds, member, pod_group, reasons, replica_of, seen

NOTE = "room is being made for it by preempting pods of lower priority"


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def node(fake: FakeApiServer) -> str:
    (name,) = seed_cluster(fake, 1, 4)
    return name


@pytest.fixture
def replica(fake: FakeApiServer, node: str) -> Iterator[Replica]:
    r = replica_of(fake, preemption=PreemptionSettings(retry_s=0.0))
    assert wait_for(lambda: "budgets" in r.cache.synced)
    yield r
    r.close()


def single(fake: FakeApiServer, r: Replica, node: str, name: str, priority: int,
           labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A one-GPU pod of ``priority``, bound by the extender."""
    pod = pod_obj(name, GPU, labels=labels)
    pod["spec"]["priority"] = priority
    pod = fake.seed("pods", pod)
    assert wait_for(lambda: pod["metadata"]["uid"] in r.cache.unbound)
    assert schedule(r.extender, pod, [node]) == (node, "")
    return pod


def gang(fake: FakeApiServer, r: Replica, name: str, priorities: list[int],
         min_count: int | None = None, policy: str | None = None) -> list[dict[str, Any]]:
    fake.seed("podgroups", pod_group(name, min_count or len(priorities)))
    pods = []
    for k, priority in enumerate(priorities):
        pod = member(f"{name}-{k}", name, GPU, priority=priority)
        if policy:
            pod["spec"]["preemptionPolicy"] = policy
        pods.append(fake.seed("pods", pod))
    assert wait_for(lambda: seen(r, pods) and f"default/{name}" in str(r.cache.gangs.groups))
    return pods


def running_gang(fake: FakeApiServer, r: Replica, node: str, name: str,
                 priorities: list[int]) -> list[dict[str, Any]]:
    """A gang whose members are all bound."""
    pods = gang(fake, r, name, priorities)
    for pod in pods:
        assert schedule(r.extender, pod, [node]) == (node, "")
    assert wait_for(lambda: all(r.cache.pods[p["metadata"]["uid"]].node for p in pods))
    return pods


def settled(r: Replica) -> bool:
    room = r.extender.gangs.room if r.extender.gangs is not None else None
    assert room is not None
    return wait_for(lambda: not room.planning and not room.inflight)


def alive(fake: FakeApiServer, pods: list[dict[str, Any]]) -> list[bool]:
    return [fake.get("pods", p["metadata"]["name"], "default") is not None for p in pods]


def evictions(fake: FakeApiServer) -> list[str]:
    return [path for method, path in fake.requests
            if method == "POST" and path.endswith("/eviction")]


def events(fake: FakeApiServer, reason: str) -> list[dict[str, Any]]:
    return [e for e in fake.objects("events") if e.get("reason") == reason]


def uids(pods: list[dict[str, Any]]) -> set[str]:
    return {p["metadata"]["uid"] for p in pods}


def test_a_gang_of_higher_priority_preempts_lower_pods_and_binds_whole(
        fake: FakeApiServer, replica: Replica, node: str) -> None:
    low = [single(fake, replica, node, f"low{k}", p) for k, p in enumerate([30, 10, 20, 40])]
    urgent = gang(fake, replica, "urgent", [1000, 1000])
    answer = answer_of(replica, urgent[0], [node])
    assert answer["NodeNames"] == [] and any(NOTE in r for r in reasons(answer)), answer
    assert settled(replica)
    assert alive(fake, low) == [True, False, False, True]  # the two of lowest priority
    held = holds(fake)
    assert set(held) == uids(urgent)
    ledger = view_of(fake.get("gpuledgers", node) or {})
    victims = {low[1]["metadata"]["uid"], low[2]["metadata"]["uid"]}
    assert all(set(ledger.entries[u].displaces) == victims for u in uids(urgent))
    assert {e["involvedObject"]["uid"] for e in events(fake, "Preempted")} == victims
    assert {e["involvedObject"]["uid"] for e in events(fake, "GpupoolPreempting")} == \
        uids(urgent)
    assert wait_for(lambda: not victims & set(replica.cache.pods))
    for pod in urgent:  # each member binds to the slices held for it
        assert schedule(replica.extender, pod, [node]) == (node, "")
    assert holds(fake) == {} and len(evictions(fake)) == 2


def test_a_victim_gang_goes_whole_never_in_part(
        fake: FakeApiServer, replica: Replica, node: str) -> None:
    old = running_gang(fake, replica, node, "old", [0, 0])
    vips = [single(fake, replica, node, f"vip{k}", 2000) for k in range(2)]
    new = gang(fake, replica, "new", [1000])  # one GPU needed
    answer_of(replica, new[0], [node])
    assert settled(replica)
    assert alive(fake, old) == [False, False]  # both members, though one GPU would do
    assert alive(fake, vips) == [True, True]
    assert set(holds(fake)) == uids(new)


def test_a_gang_is_never_evicted_in_part_when_one_member_may_not_go(
        fake: FakeApiServer, replica: Replica, node: str) -> None:
    old = running_gang(fake, replica, node, "old", [0, 2000])  # one member outranks new
    vips = [single(fake, replica, node, f"vip{k}", 2000) for k in range(2)]
    new = gang(fake, replica, "new", [1000])
    answer_of(replica, new[0], [node])
    assert settled(replica)
    assert alive(fake, old + vips) == [True] * 4 and evictions(fake) == []
    assert holds(fake) == {}


def test_nobody_is_evicted_when_the_room_would_still_not_suffice(
        fake: FakeApiServer, replica: Replica, node: str) -> None:
    pods = [single(fake, replica, node, f"p{k}", p) for k, p in enumerate([0, 0, 0, 2000])]
    urgent = gang(fake, replica, "urgent", [1000] * 4)  # every GPU, one of them outranks it
    answer_of(replica, urgent[0], [node])
    assert settled(replica)
    assert alive(fake, pods) == [True] * 4 and evictions(fake) == []
    assert holds(fake) == {} and fake.objects("leases") == []  # its claim let go
    assert answer_of(replica, urgent[1], [node])["NodeNames"] == []  # it waits whole
    assert settled(replica) and evictions(fake) == [] and holds(fake) == {}


def test_a_disruption_budget_is_honoured_for_a_gang(
        fake: FakeApiServer, replica: Replica, node: str) -> None:
    guarded = [single(fake, replica, node, f"db{k}", 0, {"app": "db"}) for k in range(2)]
    vips = [single(fake, replica, node, f"vip{k}", 2000) for k in range(2)]
    fake.seed("poddisruptionbudgets", {
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "db"}}},
        "status": {"disruptionsAllowed": 1}})
    assert wait_for(lambda: "default/db" in replica.cache.budgets.by_name)
    urgent = gang(fake, replica, "urgent", [1000, 1000])  # needs both guarded pods' GPUs
    answer_of(replica, urgent[0], [node])
    assert settled(replica)
    assert alive(fake, guarded + vips) == [True] * 4 and evictions(fake) == []


def test_a_gang_with_a_member_that_never_preempts_waits(
        fake: FakeApiServer, replica: Replica, node: str) -> None:
    low = [single(fake, replica, node, f"low{k}", 0) for k in range(4)]
    urgent = gang(fake, replica, "urgent", [1000, 1000], policy="Never")
    answer = answer_of(replica, urgent[0], [node])
    assert not any(NOTE in r for r in reasons(answer))
    assert settled(replica) and alive(fake, low) == [True] * 4


def test_a_refused_eviction_releases_the_gangs_holds_and_warns_its_members(
        fake: FakeApiServer, replica: Replica, node: str) -> None:
    fake.seed("tenantquotas", {"metadata": {"name": "t"},
                               "spec": {"namespaces": ["default"], "limits": {"gpus": 8}}})
    assert wait_for(lambda: len(replica.cache.catalogue.tenants) == 1)
    low = [single(fake, replica, node, f"low{k}", 0) for k in range(4)]
    urgent = gang(fake, replica, "urgent", [1000, 1000])
    fake.fail_next("POST", "eviction", 429, "Cannot evict pod as it would violate the pod's "
                   "disruption budget.")
    answer_of(replica, urgent[0], [node])
    assert settled(replica)
    assert holds(fake) == {}  # the gang holds nothing again, nor is it charged
    ledger = view_of(fake.get("quotaledgers", "tenant.t") or {})
    assert not uids(urgent) & set(ledger.entries)
    assert sum(alive(fake, low)) >= 3
    warned = events(fake, "GpupoolPreemptionFailed")
    assert {e["involvedObject"]["uid"] for e in warned} == uids(urgent)
    assert all(e["type"] == "Warning" for e in warned)
