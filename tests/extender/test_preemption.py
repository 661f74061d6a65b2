"""Preemption of GPU slices, carried out by the extender over the FAKE API server.

Four pods of low priority hold the four GPUs of a node; a pod of high priority asks 60000
MiB of one GPU. Filter finds no room and answers; the extender picks the victim with the
core off the cache lock, holds the freed slices for the pod in the node's GPULedger, evicts
the victim through the Eviction API and records Events; the retried pod's filter says room
is being made, then the pod fits, and its bind replaces its hold. Then: disruption budgets
(read, and a 429 from the Eviction API), two replicas that never make one room twice, a
pod that goes away or a hold that expires, pods that may not preempt, and
kube-scheduler's own preempt verb.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.extender.bind.reconcile import LedgerReconciler
from gpupool.extender.preemption.plans import PreemptionSettings
from tests.go_format import sprintf
from tests.waiting import wait_for

from .builders import Replica, pod_obj, schedule, seed_cluster

MIB = {"gpupool.io/gpu-memory": "60000", "gpupool.io/gpu-core": "50"}
FAST = PreemptionSettings(hold_s=60.0, retry_s=0.0)  # GPU heartbeats go stale at 120 s


class Clock:
    def __init__(self) -> None:
        import time
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def node(fake: FakeApiServer) -> str:
    (name,) = seed_cluster(fake, 1, 4, memory_mib=81920, prefix="gpu-node-")
    return name


def start(fake: FakeApiServer, clock: Clock, settings: PreemptionSettings = FAST) -> Replica:
    r = Replica(fake, clock=clock, preemption=settings)
    assert wait_for(lambda: "budgets" in r.cache.synced)
    return r


@pytest.fixture
def replica(fake: FakeApiServer, node: str, clock: Clock) -> Iterator[Replica]:
    r = start(fake, clock)
    yield r
    r.close()


def with_priority(pod: dict[str, Any], priority: int | None,
                  policy: str | None = None) -> dict[str, Any]:
    if priority is not None:
        pod["spec"]["priority"] = priority
    if policy is not None:
        pod["spec"]["preemptionPolicy"] = policy
    return pod


def fill(fake: FakeApiServer, r: Replica, node: str, priorities: list[int],
         labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """One pod per GPU (60000 MiB each) of the given priorities, bound by the extender."""
    pods = []
    for k, prio in enumerate(priorities):
        pod = fake.seed("pods", with_priority(pod_obj(f"low{k}", MIB, labels=labels), prio))
        assert wait_for(lambda p=pod: p["metadata"]["uid"] in r.cache.unbound)
        assert schedule(r.extender, pod, [node]) == (node, "")
        pods.append(pod)
    assert wait_for(lambda: sum(1 for f in r.cache.pods.values() if f.decision) == len(pods))
    return pods


def high(fake: FakeApiServer, r: Replica, name: str = "urgent", priority: int = 1000,
         policy: str | None = None) -> dict[str, Any]:
    pod = fake.seed("pods", with_priority(pod_obj(name, MIB), priority, policy))
    assert wait_for(lambda: pod["metadata"]["uid"] in r.cache.unbound)
    return pod


def filtered(r: Replica, pod: dict[str, Any], *nodes: str) -> dict[str, Any]:
    """Filter's answer; every reason in it survives kube-scheduler's Go formatting."""
    answer: dict[str, Any] = r.extender.filter({"Pod": pod, "NodeNames": list(nodes)})
    for text in [answer["Error"], *answer["FailedNodes"].values(),
                 *answer["FailedAndUnresolvableNodes"].values()]:
        assert sprintf(text) == text
    return answer


def settled(r: Replica) -> bool:
    """No plan is being made or carried out."""
    preemptor = r.extender.preemptor
    assert preemptor is not None
    return wait_for(lambda: not preemptor.planning and not preemptor.inflight)


def ledger_entries(fake: FakeApiServer, node: str) -> dict[str, Any]:
    obj = fake.get("gpuledgers", node)
    return dict((obj or {}).get("spec", {}).get("entries") or {})


def events(fake: FakeApiServer, reason: str) -> list[dict[str, Any]]:
    return [e for e in fake.objects("events") if e.get("reason") == reason]


def evictions(fake: FakeApiServer) -> list[str]:
    return [path for method, path in fake.requests
            if method == "POST" and path.endswith("/eviction")]


def test_a_high_priority_pod_gets_room_by_evicting_the_lowest_priority_pod(
        fake: FakeApiServer, replica: Replica, node: str) -> None:
    low = fill(fake, replica, node, [30, 10, 20, 40])
    pod = high(fake, replica)
    answer = filtered(replica, pod, node)
    assert answer["NodeNames"] == []
    assert "have room" in answer["FailedNodes"][node]  # the plan is made after the answer
    assert settled(replica)
    victim = low[1]
    assert fake.get("pods", victim["metadata"]["name"], "default") is None
    assert [fake.get("pods", p["metadata"]["name"], "default") is not None for p in low] == \
        [True, False, True, True]
    hold = ledger_entries(fake, node)[pod["metadata"]["uid"]]
    assert hold["kind"] == "hold" and hold["displaces"] == [victim["metadata"]["uid"]]
    (preempted,) = events(fake, "Preempted")
    assert preempted["involvedObject"]["uid"] == victim["metadata"]["uid"]
    assert "urgent" in preempted["message"] and preempted["type"] == "Normal"
    (making,) = events(fake, "GpupoolPreempting")
    assert making["involvedObject"]["uid"] == pod["metadata"]["uid"]
    assert "default/low1 (priority 10)" in making["message"]
    # the retried pod fits where room was made, its bind replacing its hold
    assert wait_for(lambda: victim["metadata"]["uid"] not in replica.cache.pods)
    assert schedule(replica.extender, pod, [node]) == (node, "")
    entry = ledger_entries(fake, node)[pod["metadata"]["uid"]]
    assert "kind" not in entry and victim["metadata"]["uid"] not in ledger_entries(fake, node)
    assert len(evictions(fake)) == 1
    assert replica.extender.metrics.preempted._value.get() == 1


def test_while_the_room_is_made_the_node_says_so_and_comes_first(
        fake: FakeApiServer, replica: Replica, node: str) -> None:
    fill(fake, replica, node, [5, 5, 5])
    leaving = fake.seed("pods", with_priority(pod_obj("going", MIB), 5))
    assert wait_for(lambda: leaving["metadata"]["uid"] in replica.cache.unbound)
    assert schedule(replica.extender, leaving, [node]) == (node, "")
    fake.patch("pods", "going", {"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}},
               "default")  # a pod already terminating: its room is counted, nobody evicted
    assert wait_for(lambda: replica.cache.pods[leaving["metadata"]["uid"]].leaving)
    pod = high(fake, replica)
    filtered(replica, pod, node)
    assert settled(replica) and evictions(fake) == []
    (making,) = events(fake, "GpupoolPreempting")
    assert "evicted none (pods already leaving)" in making["message"]
    second = filtered(replica, pod, node)  # the hold is written; the pod still waits
    assert "waiting for 1 preempted pod to leave" in second["FailedNodes"][node]
    fake.delete("pods", "going", "default")
    assert wait_for(lambda: filtered(replica, pod, node)["NodeNames"] == [node])
    scores = replica.extender.prioritize({"Pod": pod, "NodeNames": [node]}).items()
    assert scores == [{"Host": node, "Score": 10}]


def test_a_disruption_budget_that_allows_nothing_protects_its_pods(
        fake: FakeApiServer, replica: Replica, node: str) -> None:
    guarded = fill(fake, replica, node, [1, 1], labels={"app": "db"})
    fill_more = [fake.seed("pods", with_priority(pod_obj(f"web{k}", MIB), 2)) for k in range(2)]
    for p in fill_more:
        assert wait_for(lambda p=p: p["metadata"]["uid"] in replica.cache.unbound)
        assert schedule(replica.extender, p, [node]) == (node, "")
    fake.seed("poddisruptionbudgets", {
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "db"}}},
        "status": {"disruptionsAllowed": 0}})
    assert wait_for(lambda: "default/db" in replica.cache.budgets.by_name)
    pod = high(fake, replica)
    filtered(replica, pod, node)
    assert settled(replica)
    assert all(fake.get("pods", p["metadata"]["name"], "default") for p in guarded)
    assert sum(fake.get("pods", p["metadata"]["name"], "default") is None for p in fill_more) == 1


def test_an_eviction_the_budget_refuses_removes_the_hold_and_warns_the_pod(
        fake: FakeApiServer, replica: Replica, node: str) -> None:
    low = fill(fake, replica, node, [1, 2, 3, 4])
    pod = high(fake, replica)
    fake.fail_next("POST", "eviction", 429, "Cannot evict pod as it would violate the pod's "
                   "disruption budget.")
    filtered(replica, pod, node)
    assert settled(replica)
    assert all(fake.get("pods", p["metadata"]["name"], "default") for p in low)
    assert pod["metadata"]["uid"] not in ledger_entries(fake, node)
    (warning,) = events(fake, "GpupoolPreemptionFailed")
    assert warning["type"] == "Warning" and "disruption budget" in warning["message"]
    assert replica.extender.metrics.preemptions.labels("refused")._value.get() == 1
    assert wait_for(lambda: replica.cache.live_hold(pod["metadata"]["uid"]) is None)
    filtered(replica, pod, node)  # tries again (retry_s is 0 here), and succeeds
    assert settled(replica)
    assert fake.get("pods", "low0", "default") is None


def test_two_replicas_never_evict_for_the_same_room_twice(
        fake: FakeApiServer, replica: Replica, node: str, clock: Clock) -> None:
    fill(fake, replica, node, [1, 2, 3, 4])
    other = start(fake, clock)
    try:
        pods = [high(fake, replica, "urgent"), high(fake, replica, "urgent-too")]
        assert wait_for(lambda: all(p["metadata"]["uid"] in other.cache.unbound for p in pods))
        plans: list[tuple[Replica, Any]] = []
        for r in (replica, other):  # each plans before either carries out
            assert r.extender.preemptor is not None
            r.extender.preemptor.worker.submit = (  # type: ignore[method-assign]
                lambda fn, plan, r=r: plans.append((r, plan)))
        for p in pods:  # the same pod on both replicas, and two pods for one room
            filtered(replica, p, node)
            filtered(other, p, node)
        assert wait_for(lambda: len(plans) == 4)
        assert [plan.victims[0].name for _, plan in plans] == ["low0"] * 4
        for r, plan in plans:
            assert r.extender.preemptor is not None
            r.extender.preemptor.carry_out(plan)
        assert len(evictions(fake)) == 1  # one room, made once
        holds = [u for u, e in ledger_entries(fake, node).items() if e.get("kind") == "hold"]
        assert len(holds) == 1
        abandoned = sum(r.extender.metrics.preemptions.labels("abandoned")._value.get()
                        for r in (replica, other))
        assert abandoned == 3
    finally:
        other.close()


def test_a_preemptor_that_goes_away_releases_its_hold(
        fake: FakeApiServer, replica: Replica, node: str) -> None:
    fill(fake, replica, node, [1, 2, 3, 4])
    pod = high(fake, replica)
    filtered(replica, pod, node)
    assert settled(replica)
    uid = pod["metadata"]["uid"]
    assert replica.cache.live_hold(uid) is not None
    fake.delete("pods", "urgent", "default")
    assert wait_for(lambda: replica.cache.live_hold(uid) is None)
    LedgerReconciler(replica.cache, replica.api).run_once()
    assert uid not in ledger_entries(fake, node)
    newcomer = high(fake, replica, "newcomer", priority=0)  # no priority: takes free room
    assert schedule(replica.extender, newcomer, [node]) == (node, "")


def test_a_hold_expires_and_the_room_is_anyones_again(
        fake: FakeApiServer, replica: Replica, node: str, clock: Clock) -> None:
    fill(fake, replica, node, [1, 2, 3, 4])
    pod = high(fake, replica)
    filtered(replica, pod, node)
    assert settled(replica)
    uid = pod["metadata"]["uid"]
    assert replica.cache.live_hold(uid) is not None
    newcomer = high(fake, replica, "newcomer", priority=0)
    assert schedule(replica.extender, newcomer, [node])[0] is None  # the room is held
    clock.now += 61
    replica.cache.sweep()
    assert replica.cache.live_hold(uid) is None
    LedgerReconciler(replica.cache, replica.api).run_once()
    assert uid not in ledger_entries(fake, node)
    assert schedule(replica.extender, newcomer, [node]) == (node, "")


@pytest.mark.parametrize("priority,policy", [(4, None), (1000, "Never"), (None, None)],
                         ids=["equal-priority", "preemption-policy-never", "no-priority"])
def test_a_pod_that_may_not_preempt_gets_the_plain_reasons(
        fake: FakeApiServer, replica: Replica, node: str, priority: int | None,
        policy: str | None) -> None:
    fill(fake, replica, node, [4, 4, 4, 4])
    pod = fake.seed("pods", with_priority(pod_obj("p", MIB), priority, policy))
    answer = filtered(replica, pod, node)
    assert "have room" in answer["FailedNodes"][node] and "making room" not in str(answer)
    assert settled(replica) and evictions(fake) == []


def test_kube_schedulers_preempt_keeps_only_nodes_where_its_victims_free_enough(
        fake: FakeApiServer, replica: Replica, node: str) -> None:
    low = fill(fake, replica, node, [1, 2, 3, 4])
    pod = high(fake, replica)
    uids = [p["metadata"]["uid"] for p in low]

    def preempt(victims: list[str]) -> dict[str, Any]:
        body = {"Pod": pod, "NodeNameToMetaVictims": {
            node: {"Pods": [{"UID": u} for u in victims], "NumPDBViolations": 0}}}
        answer: dict[str, Any] = replica.extender.preempt(body)
        return answer["NodeNameToMetaVictims"] or {}

    assert node in preempt(uids[:1])
    assert preempt([]) == {}
    filtered(replica, pod, node)  # gpupool's own preemption displaces low0
    assert settled(replica)
    other = high(fake, replica, "other")
    body = {"Pod": other, "NodeNameToMetaVictims": {
        node: {"Pods": [{"UID": uids[1]}], "NumPDBViolations": 0}}}
    assert node in (replica.extender.preempt(body)["NodeNameToMetaVictims"] or {})


def test_a_pod_that_fits_a_node_it_was_not_sent_waits_for_another_window_first(
        fake: FakeApiServer, replica: Replica, node: str) -> None:
    fill(fake, replica, node, [1, 2, 3, 4])
    (spare,) = seed_cluster(fake, 1, 1, memory_mib=81920, prefix="spare-")
    assert wait_for(lambda: spare in replica.cache.nodes and any(
        d.node == spare for d in replica.cache.devices.values()))  # laid out at the next call
    pod = high(fake, replica)
    assert filtered(replica, pod, spare, node)["NodeNames"] == [spare]  # room: no preemption
    for _ in range(2):  # kube-scheduler's window held only the full node: try another one
        answer = filtered(replica, pod, node)
        assert "making room" not in answer["FailedNodes"][node]
    assert evictions(fake) == []
    filtered(replica, pod, node)  # sent only the full node again: ruled out for it
    assert settled(replica) and len(evictions(fake)) == 1
    answer = filtered(replica, pod, node)
    assert answer["NodeNames"] == [node] or "making room here" in answer["FailedNodes"][node]


def test_a_hold_whose_replica_stopped_before_evicting_is_carried_out_by_the_next(
        fake: FakeApiServer, replica: Replica, node: str, clock: Clock) -> None:
    low = fill(fake, replica, node, [1, 2, 3, 4])
    pod = high(fake, replica)
    preemptor = replica.extender.preemptor
    assert preemptor is not None
    plans: list[Any] = []
    preemptor.worker.submit = lambda fn, plan: plans.append(plan)  # type: ignore[method-assign]
    filtered(replica, pod, node)
    assert wait_for(lambda: len(plans) == 1)
    assert preemptor._write_hold(plans[0])  # then the process stops: nothing evicted
    replica.close()
    successor = start(fake, clock)
    try:
        assert wait_for(lambda: successor.cache.live_hold(pod["metadata"]["uid"]) is not None)
        waiting = filtered(successor, pod, node)  # too soon to tell a crash from a slow replica
        assert "waiting for 1 preempted pod" in waiting["FailedNodes"][node]
        assert settled(successor) and evictions(fake) == []
        clock.now += 31
        filtered(successor, pod, node)
        assert settled(successor)
        assert fake.get("pods", low[0]["metadata"]["name"], "default") is None
        assert len(evictions(fake)) == 1 and len(events(fake, "Preempted")) == 1
    finally:
        successor.close()
