"""Gangs through the FAKE API server (real client, informers, GPULedgers and Leases): a gang
is held whole or not at all, its members bind to the slices held for them, holds end at
the timeout or when the gang cannot complete, two gangs never deadlock, two replicas never
split one, quotas and preemption treat a gang as a whole (docs/gangs.md)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract import annotations as records
from gpupool.contract import names
from gpupool.extender.bind.gangclaims import GangSettings, claim_name
from gpupool.extender.preemption.plans import PreemptionSettings
from gpupool.extender.state.ledger import view_of
from tests.go_format import sprintf
from tests.waiting import wait_for

from .builders import NAMESPACE, Replica, pod_obj, schedule, seed_cluster

GPU = {"gpupool.io/gpu": "1"}
SLICE = {"gpupool.io/gpu-memory": "30720", "gpupool.io/gpu-core": "50"}  # one a GPU


class Clock:
    """A clock the test moves (holds and claims expire by it)."""

    def __init__(self) -> None:
        import time
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def pod_group(name: str, min_count: int, ns: str = "default",
              notes: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "annotations": notes or {}},
            "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}}}


def member(name: str, group: str, limits: dict[str, str], ns: str = "default",
           priority: int = 0) -> dict[str, Any]:
    pod = pod_obj(name, limits, ns=ns)
    pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    pod["spec"]["priority"] = priority
    return pod


def labelled(name: str, gang: str, min_count: int, limits: dict[str, str]) -> dict[str, Any]:
    return pod_obj(name, limits, labels={names.LABEL_GANG: gang},
                   annotations={names.ANNOTATION_GANG_MIN_COUNT: str(min_count)})


def seed_gang(fake: FakeApiServer, group: str, size: int, limits: dict[str, str],
              min_count: int | None = None, ns: str = "default") -> list[dict[str, Any]]:
    fake.seed("podgroups", pod_group(group, min_count or size, ns))
    return [fake.seed("pods", member(f"{group}-{k}", group, limits, ns)) for k in range(size)]


def holds(fake: FakeApiServer) -> dict[str, str]:
    """Pod uid -> node of every hold in the GPULedgers (no pod holds twice)."""
    found = [(uid, view.node) for view in map(view_of, fake.objects("gpuledgers"))
             for uid, e in view.entries.items() if e.is_hold]
    out = dict(found)
    assert len(out) == len(found), f"a pod holds on several nodes: {sorted(found)}"
    return out


def binds(fake: FakeApiServer) -> dict[str, str]:
    """Pod uid -> node of every bound pod."""
    return {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in fake.objects("pods")
            if p["spec"].get("nodeName")}


def answer_of(replica: Replica, pod: dict[str, Any], nodes: list[str]) -> dict[str, Any]:
    """Filter's answer; every reason in it comes out of kube-scheduler's formatting as is."""
    result: dict[str, Any] = replica.extender.filter({"Pod": pod, "NodeNames": nodes})
    texts = [*result["FailedNodes"].values(), *result["FailedAndUnresolvableNodes"].values()]
    assert [t for t in texts if sprintf(t) != t] == []
    return result


def reasons(answer: dict[str, Any]) -> set[str]:
    return set(answer["FailedNodes"].values()) | \
        set(answer["FailedAndUnresolvableNodes"].values())


def seen(replica: Replica, pods: list[dict[str, Any]], groups: int = 1) -> bool:
    cache = replica.cache
    return all(p["metadata"]["uid"] in cache.unbound for p in pods) and \
        len(cache.gangs.groups) >= groups


def held_gang(fake: FakeApiServer, replica: Replica, group: str, size: int,
              nodes: list[str]) -> list[dict[str, Any]]:
    """A gang of ``size`` one-GPU members whose first member's filter held it."""
    gang = seed_gang(fake, group, size, GPU)
    assert wait_for(lambda: seen(replica, gang))
    assert len(answer_of(replica, gang[0], nodes)["NodeNames"]) == 1
    return gang


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


def replica_of(fake: FakeApiServer, instance: str = "r1", clock: Any = None,
               **kwargs: Any) -> Replica:
    settings = GangSettings(timeout_s=60.0, namespace=NAMESPACE, instance=instance)
    return Replica(fake, gangs=settings, **({"clock": clock} if clock else {}), **kwargs)


def test_a_gang_that_fits_is_held_whole_and_each_member_binds_to_its_held_slice(
        fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 2, 2)
    replica = replica_of(fake)
    try:
        gang = seed_gang(fake, "train", 4, SLICE)
        assert wait_for(lambda: seen(replica, gang))
        first = answer_of(replica, gang[0], nodes)
        assert len(first["NodeNames"]) == 1, first
        held = holds(fake)
        assert set(held) == {p["metadata"]["uid"] for p in gang}  # all four, at once
        other = fake.seed("pods", pod_obj("outsider", {"gpupool.io/gpu-memory": "20480"}))
        assert wait_for(lambda: other["metadata"]["uid"] in replica.cache.unbound)
        refused = answer_of(replica, other, nodes)
        assert refused["NodeNames"] == []  # the held slices are nobody else's
        for pod in gang:
            assert schedule(replica.extender, pod, nodes) == (held[pod["metadata"]["uid"]], "")
        assert holds(fake) == {}  # every hold became its member's decision
        for pod in fake.objects("pods"):
            if pod["metadata"]["name"].startswith("train-"):
                uid = pod["metadata"]["uid"]
                decision = records.holding(uid, pod["metadata"]["annotations"],
                                           pod["spec"]["nodeName"])
                assert decision is not None and decision.node == held[uid]
        assert wait_for(lambda: replica.extender.sweep_gangs() == ["PodGroup default/train"])
        assert fake.get("leases", claim_name_of("train"), NAMESPACE) is None
    finally:
        replica.close()


def claim_name_of(group: str, ns: str = "default") -> str:
    from gpupool.contract.gangs import GangRef
    return claim_name(GangRef(ns, group, True))


def test_a_gang_that_does_not_fit_holds_nothing_and_waits_whole_with_one_reason(
        fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 2, 2)
    replica = replica_of(fake)
    try:
        gang = seed_gang(fake, "big", 5, GPU)  # 5 whole GPUs on 4
        assert wait_for(lambda: seen(replica, gang))
        for pod in gang:
            answer = answer_of(replica, pod, nodes)
            assert answer["NodeNames"] == []
            assert len(reasons(answer)) == 1, answer
            assert "PodGroup default/big" in next(iter(reasons(answer)))
        assert holds(fake) == {}
        assert fake.objects("leases") == [] or all(
            lease["metadata"]["name"] != claim_name_of("big") for lease in fake.objects("leases"))
        plain = fake.seed("pods", pod_obj("plain", GPU))
        assert schedule(replica.extender, plain, nodes)[1] == ""  # the room is anyone's
    finally:
        replica.close()


def test_holds_whose_members_never_bind_end_at_the_timeout(fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 1, 2)
    clock = Clock()
    replica = replica_of(fake, clock=clock)
    try:
        held_gang(fake, replica, "slow", 2, nodes)
        assert len(holds(fake)) == 2
        plain = fake.seed("pods", pod_obj("plain", GPU))
        assert wait_for(lambda: plain["metadata"]["uid"] in replica.cache.unbound)
        assert answer_of(replica, plain, nodes)["NodeNames"] == []
        clock.now += 61.0  # past the gang's timeout: nothing bound
        replica.cache.sweep()
        assert replica.extender.sweep_gangs() == ["PodGroup default/slow"]
        assert fake.get("leases", claim_name_of("slow"), NAMESPACE) is None
        assert schedule(replica.extender, plain, nodes)[1] == ""
    finally:
        replica.close()


def test_two_gangs_for_the_same_gpus_one_wins_whole_the_other_waits_whole(
        fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 1, 4)
    replica = replica_of(fake)
    try:
        a = seed_gang(fake, "a", 4, GPU)
        b = seed_gang(fake, "b", 4, GPU)
        assert wait_for(lambda: seen(replica, a + b, groups=2))
        for pa, pb in zip(a, b, strict=True):  # kube-scheduler's cycles interleave
            answer_of(replica, pa, nodes)
            answer_of(replica, pb, nodes)
        held = holds(fake)
        a_uids = {p["metadata"]["uid"] for p in a}
        assert set(held) == a_uids  # a whole; b holds nothing
        for pod in a:
            assert schedule(replica.extender, pod, nodes)[1] == ""
        waiting = answer_of(replica, b[0], nodes)
        assert waiting["NodeNames"] == [] and holds(fake) == {}
        for pod in a:  # a finishes: b is placed whole
            fake.delete("pods", pod["metadata"]["name"], "default")
        assert wait_for(lambda: not replica.cache.state.allocations)
        assert len(answer_of(replica, b[1], nodes)["NodeNames"]) == 1
        assert set(holds(fake)) == {p["metadata"]["uid"] for p in b}
    finally:
        replica.close()


def test_two_replicas_racing_for_one_gang_hold_it_once(fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 4, 4)
    one, two = replica_of(fake, "r1"), replica_of(fake, "r2", policy="spread")  # unlike
    # placements: two placements of one gang would hold a member on two nodes
    try:
        gang = seed_gang(fake, "a", 4, GPU)
        assert wait_for(lambda: seen(one, gang) and seen(two, gang))
        barrier = threading.Barrier(2)
        answers: list[dict[str, Any]] = []

        def race(replica: Replica, pod: dict[str, Any]) -> None:
            barrier.wait()
            answers.append(answer_of(replica, pod, nodes))

        threads = [threading.Thread(target=race, args=(one, gang[0])),
                   threading.Thread(target=race, args=(two, gang[1]))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        held = holds(fake)  # no member holds twice
        assert set(held) == {p["metadata"]["uid"] for p in gang}
        (claim,) = [c for c in fake.objects("leases") if c["metadata"]["name"] ==
                    claim_name_of("a")]
        assert claim["spec"]["holderIdentity"] in ("r1", "r2")
        for k, pod in enumerate(gang):
            replica, uid = (one, two)[k % 2], pod["metadata"]["uid"]
            assert wait_for(lambda r=replica, u=uid: u in r.cache.holds)  # type: ignore[misc]
            assert schedule(replica.extender, pod, nodes) == (held[uid], "")
    finally:
        one.close()
        two.close()


def test_racing_replicas_never_split_a_gang_and_two_gangs_never_deadlock(
        fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 2, 4)
    one, two = replica_of(fake, "r1"), replica_of(fake, "r2", policy="spread")
    try:
        a = seed_gang(fake, "a", 6, GPU)
        b = seed_gang(fake, "b", 6, GPU)
        assert wait_for(lambda: seen(one, a + b, 2) and seen(two, a + b, 2))
        barrier = threading.Barrier(4)

        def race(replica: Replica, pod: dict[str, Any]) -> None:
            barrier.wait()
            answer_of(replica, pod, nodes)

        threads = [threading.Thread(target=race, args=args) for args in
                   ((one, a[0]), (two, a[1]), (one, b[0]), (two, b[1]))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        held = holds(fake)
        gangs = [{p["metadata"]["uid"] for p in g} for g in (a, b)]
        # never split: one gang whole (8 GPUs hold one of 6 + 6), or, when each replica
        # lost a node to the other in the same moment, neither (both let everything go)
        assert set(held) in [set(), *gangs]
        if not held:  # nothing left behind blocks the next try: it holds one gang whole

            def retried() -> bool:
                for replica, pod in ((one, a[0]), (two, b[0]), (two, a[0]), (one, b[0])):
                    answer_of(replica, pod, nodes)
                    if holds(fake):
                        return True
                return False

            assert wait_for(retried)
            held = holds(fake)
            assert set(held) in gangs
        winner = a if set(held) == gangs[0] else b
        for k, pod in enumerate(winner):  # filters and binds go to either replica
            replica, uid = (one, two)[k % 2], pod["metadata"]["uid"]
            assert wait_for(lambda r=replica, u=uid: u in r.cache.holds)  # type: ignore[misc]
            assert schedule(replica.extender, pod, nodes) == (held[uid], "")
        assert set(binds(fake)) == set(held)
    finally:
        one.close()
        two.close()


def test_a_gang_over_its_tenants_quota_waits_whole_with_the_quota_as_its_reason(
        fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 2, 4)
    fake.seed("tenantquotas", {"metadata": {"name": "lab"},
                               "spec": {"namespaces": ["lab"], "limits": {"gpus": 3}}})
    replica = replica_of(fake)
    try:
        assert wait_for(lambda: len(replica.cache.catalogue.tenants) == 1)
        gang = seed_gang(fake, "train", 4, GPU, ns="lab")  # each alone would fit
        assert wait_for(lambda: seen(replica, gang))
        answer = answer_of(replica, gang[0], nodes)
        assert answer["NodeNames"] == []
        (why,) = reasons(answer)
        assert "gang PodGroup lab/train" in why and "quota of tenant lab exceeded" in why
        assert holds(fake) == {}
    finally:
        replica.close()


def test_a_member_deleted_mid_placement_releases_the_whole_gang(fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 1, 4)
    replica = replica_of(fake)
    try:
        gang = held_gang(fake, replica, "train", 4, nodes)
        assert schedule(replica.extender, gang[0], nodes)[1] == ""  # one member bound
        fake.delete("pods", gang[3]["metadata"]["name"], "default")
        assert wait_for(lambda: gang[3]["metadata"]["uid"] not in replica.cache.gangs.gang_of)
        assert replica.extender.sweep_gangs() == ["PodGroup default/train"]
        assert holds(fake) == {}  # the two members still pending hold nothing
        answer = answer_of(replica, gang[1], nodes)
        assert answer["NodeNames"] == []
        assert any("2 of the 3 members it needs" in r for r in reasons(answer)), answer
    finally:
        replica.close()


def test_a_deleted_podgroup_releases_its_holds(fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 1, 4)
    replica = replica_of(fake)
    try:
        gang = held_gang(fake, replica, "train", 3, nodes)
        assert len(holds(fake)) == 3
        assert replica.extender.sweep_gangs() == []  # still waiting for its binds
        fake.delete("podgroups", "train", "default")
        assert wait_for(lambda: not replica.cache.gangs.groups)
        assert replica.extender.sweep_gangs() == ["PodGroup default/train"]
        assert holds(fake) == {}
        answer = answer_of(replica, gang[1], nodes)
        assert reasons(answer) == {"gpupool: PodGroup default/train does not exist (yet): its "
                                   "pods wait for it"}
    finally:
        replica.close()


def test_preemption_never_takes_a_gang_member_as_a_victim(fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 1, 2)
    replica = replica_of(fake, preemption=PreemptionSettings(retry_s=0.0))
    try:
        gang = seed_gang(fake, "low", 2, GPU)
        assert wait_for(lambda: seen(replica, gang))
        for pod in gang:
            assert schedule(replica.extender, pod, nodes)[1] == ""
        urgent = pod_obj("urgent", GPU)
        urgent["spec"]["priority"] = 1000
        urgent = fake.seed("pods", urgent)
        assert wait_for(lambda: "budgets" in replica.cache.synced and
                        urgent["metadata"]["uid"] in replica.cache.unbound)
        assert answer_of(replica, urgent, nodes)["NodeNames"] == []
        assert wait_for(lambda: replica.extender.preemptor is not None and
                        not replica.extender.preemptor.planning)
        assert len(fake.objects("pods")) == 3  # nobody evicted
        assert holds(fake) == {}
        verdict = replica.extender.preempt({"Pod": urgent, "NodeNameToMetaVictims": {
            nodes[0]: {"Pods": [{"UID": gang[0]["metadata"]["uid"]}]}}})
        assert verdict["NodeNameToMetaVictims"] == {}  # kube-scheduler's proposal refused
    finally:
        replica.close()


def test_a_labelled_gang_is_held_whole_without_the_podgroup_api(fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 2, 2)
    replica = Replica(fake)  # no PodGroup informer: a cluster without the gate
    try:
        gang = [fake.seed("pods", labelled(f"w{k}", "job", 4, GPU)) for k in range(4)]
        assert wait_for(lambda: seen(replica, gang, groups=0))
        assert len(answer_of(replica, gang[2], nodes)["NodeNames"]) == 1
        held = holds(fake)
        assert set(held) == {p["metadata"]["uid"] for p in gang}
        for pod in gang:
            assert schedule(replica.extender, pod, nodes) == (held[pod["metadata"]["uid"]], "")
    finally:
        replica.close()


def test_the_shipped_rbac_covers_what_gangs_need(fake: FakeApiServer) -> None:
    from tests.rbac_grants import grants, manifest, needed, refused, writes
    nodes = seed_cluster(fake, 1, 2)
    replica = replica_of(fake)
    try:
        gang = seed_gang(fake, "train", 2, GPU)
        assert wait_for(lambda: seen(replica, gang))
        for pod in gang:
            assert schedule(replica.extender, pod, nodes)[1] == ""
        assert replica.extender.sweep_gangs() == ["PodGroup default/train"]
    finally:
        replica.close()
    calls = needed(fake.requests)
    assert ("scheduling.k8s.io", "podgroups", "list") in {(c.group, c.resource, c.verb)
                                                          for c in calls}
    assert refused(calls, grants(manifest("extender", "rbac.yaml"), "gpupool-extender")) == set()
    assert writes(calls) == {("", "pods/binding"), ("gpupool.io", "gpuledgers"),
                             ("coordination.k8s.io", "leases"), ("", "secrets"),
                             ("", "configmaps")}  # never a pod, nor a PodGroup


def test_labelled_members_that_disagree_make_their_gang_wait(fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 1, 4)
    replica = Replica(fake)
    try:
        pods = [fake.seed("pods", labelled("w0", "job", 2, GPU)),
                fake.seed("pods", labelled("w1", "job", 3, GPU))]
        assert wait_for(lambda: seen(replica, pods, groups=0))
        answer = answer_of(replica, pods[0], nodes)
        assert answer["NodeNames"] == [] and holds(fake) == {}
        assert reasons(answer) == {"gpupool: gang default/job: its members disagree on what "
                                   "they ask (min counts 2, 3, or where)"}
    finally:
        replica.close()


def test_a_member_the_informer_has_not_shown_yet_waits_and_a_body_places_no_gang(
        fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 1, 4)
    replica = replica_of(fake)
    try:
        early = member("early", "train", GPU)
        early["metadata"]["uid"] = "not-listed-yet"
        answer = answer_of(replica, early, nodes)
        assert answer["NodeNames"] == []
        assert reasons(answer) == {"gpupool: PodGroup default/train: this member is not in "
                                   "gpupool's view of the cluster yet"}
        plain = fake.seed("pods", pod_obj("plain", GPU))  # a body naming a gang for a pod
        assert wait_for(lambda: seen(replica, [plain], groups=0))  # the informer shows
        posing = {**plain, "spec": {**plain["spec"], "schedulingGroup": {  # without one
            "podGroupName": "train"}}}
        assert len(answer_of(replica, posing, nodes)["NodeNames"]) == 1  # placed as itself
        assert holds(fake) == {} and fake.objects("leases") == []
    finally:
        replica.close()
