"""Assumptions: a placement handed to kube-scheduler's bind counts as taken for the next
pods until its bind comes (or it expires, or a record of the cluster needs the room), and
this replica's concurrent binds on one node share its ledger's writes."""

from __future__ import annotations

import threading
import time
from typing import Any

from gpupool_testing.fake_apiserver import FakeApiServer
from waiting import wait_for

from gpupool.extender.service import Extender
from gpupool.extender.state.assumptions import ASSUME_EXPIRY_S

from .builders import Replica, pod_obj, seed_cluster
from .test_replicas import recorded_state

TWO = {"gpupool.io/gpu": "2"}


def bind_body(pod: dict[str, Any], node: str) -> dict[str, str]:
    meta = pod["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"],
            "Node": node}


def seeded(fake: FakeApiServer, *replicas: Replica, names: tuple[str, ...] = ("a", "b"),
           limits: dict[str, str] = TWO) -> list[dict[str, Any]]:
    """Pending pods, once every replica's informer has them (an assumption is made only
    for a pod the informer knows: kube-scheduler's informer and the extender's see a new
    pod at about the same time)."""
    pods = [fake.seed("pods", pod_obj(n, limits)) for n in names]
    for r in replicas:
        assert wait_for(lambda r=r: all(p["metadata"]["uid"] in r.cache.unbound for p in pods))
    return pods


def scores(ext: Extender, pod: dict[str, Any], nodes: list[str]) -> dict[str, int]:
    answer = ext.prioritize({"Pod": pod, "NodeNames": nodes})
    return {h["Host"]: h["Score"] for h in answer.items()}


def outcome(ext: Extender, name: str) -> float:
    return ext.metrics.registry.get_sample_value(
        "gpupool_extender_assumptions_total", {"outcome": name}) or 0.0


def test_a_placement_handed_to_bind_is_not_offered_to_the_next_pod(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    ext = replica.extender
    a, b = seeded(fake, replica)
    assert ext.filter({"Pod": a, "NodeNames": nodes})["NodeNames"] == nodes
    ranked = scores(ext, a, nodes)
    picked = [n for n, s in ranked.items() if s == 10]
    assert len(picked) == 1  # one node alone at the top: the one kube-scheduler binds
    answer = ext.filter({"Pod": b, "NodeNames": nodes})  # a's bind has not come yet
    assert picked[0] not in answer["NodeNames"] and len(answer["NodeNames"]) == 2
    assert "0 idle" in answer["FailedNodes"][picked[0]]
    second = max(scores(ext, b, answer["NodeNames"]).items(), key=lambda hs: hs[1])[0]
    assert ext.bind(bind_body(a, picked[0]))["Error"] == ""
    assert ext.bind(bind_body(b, second))["Error"] == ""
    assert (outcome(ext, "made"), outcome(ext, "bound")) == (2, 2)
    recorded_state(fake, nodes, 2)  # raises OverCommit if a GPU were held twice


def test_the_only_node_filter_passes_is_assumed(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    ext = replica.extender
    a, b = seeded(fake, replica)
    assert ext.filter({"Pod": a, "NodeNames": [nodes[0]]})["NodeNames"] == [nodes[0]]
    assert replica.cache.state.allocations[a["metadata"]["uid"]].node == nodes[0]
    assert ext.filter({"Pod": b, "NodeNames": [nodes[0]]})["NodeNames"] == []
    assert ext.filter({"Pod": a, "NodeNames": [nodes[0]]})["NodeNames"] == [nodes[0]]  # its
    # own assumption never keeps a pod off a node (a cycle again: the newer one replaces it)


def test_an_assumption_expires_when_its_bind_never_comes(fake: FakeApiServer,
                                                         nodes: list[str]) -> None:
    now = [time.time()]
    replica = Replica(fake, clock=lambda: now[0])
    try:
        ext = replica.extender
        a, b = seeded(fake, replica)
        assert ext.filter({"Pod": a, "NodeNames": [nodes[0]]})["NodeNames"] == [nodes[0]]
        now[0] += ASSUME_EXPIRY_S - 1
        assert ext.filter({"Pod": b, "NodeNames": [nodes[0]]})["NodeNames"] == []
        now[0] += 2  # a's bind never came
        assert ext.filter({"Pod": b, "NodeNames": [nodes[0]]})["NodeNames"] == [nodes[0]]
        assert a["metadata"]["uid"] not in replica.cache.state.allocations
        assert outcome(ext, "expired") == 1
        assert ext.bind(bind_body(b, nodes[0]))["Error"] == ""
    finally:
        replica.close()


def test_a_replicas_assumption_never_holds_back_the_other_replica(fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 1, 2)
    one, other = Replica(fake, seed=1), Replica(fake, seed=2)
    try:
        p, q = seeded(fake, one, other, names=("p", "q"))
        assert one.extender.filter({"Pod": p, "NodeNames": nodes})["NodeNames"] == nodes
        assert p["metadata"]["uid"] in one.cache.state.allocations  # assumed by one alone
        assert other.extender.filter({"Pod": q, "NodeNames": nodes})["NodeNames"] == nodes
        assert other.extender.bind(bind_body(q, nodes[0]))["Error"] == ""  # not held back
        q_uid = q["metadata"]["uid"]
        assert wait_for(lambda: q_uid in one.cache.state.allocations)  # q's entry took
        assert outcome(one.extender, "yielded") == 1  # the room from p's assumption
        error = one.extender.bind(bind_body(p, nodes[0]))["Error"]
        assert "0 idle" in error
        recorded_state(fake, nodes, 2)  # no GPU held twice
    finally:
        one.close()
        other.close()


def test_a_pod_bound_by_the_other_replica_ends_its_assumption(fake: FakeApiServer,
                                                              nodes: list[str]) -> None:
    one, other = Replica(fake, seed=1), Replica(fake, seed=2)
    try:
        [p] = seeded(fake, one, other, names=("p",))
        assert one.extender.filter({"Pod": p, "NodeNames": [nodes[0]]})["NodeNames"]
        assert other.extender.bind(bind_body(p, nodes[1]))["Error"] == ""
        uid = p["metadata"]["uid"]
        assert wait_for(lambda: one.cache.state.allocations[uid].node == nodes[1])
        assert outcome(one.extender, "yielded") == 1
        [probe] = seeded(fake, one, names=("probe",))  # n0's room is free again
        assert one.extender.filter({"Pod": probe, "NodeNames": [nodes[0]]})["NodeNames"]
    finally:
        one.close()
        other.close()


def test_a_bind_to_another_node_than_assumed_releases_the_assumed_room(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    ext = replica.extender
    [a] = seeded(fake, replica, names=("a",))
    top = max(scores(ext, a, nodes).items(), key=lambda hs: hs[1])[0]
    elsewhere = next(n for n in nodes if n != top)  # kube-scheduler's own scores won
    assert ext.bind(bind_body(a, elsewhere))["Error"] == ""
    assert replica.cache.state.allocations[a["metadata"]["uid"]].node == elsewhere
    assert outcome(ext, "moved") == 1
    b = fake.seed("pods", pod_obj("b", TWO))
    assert top in ext.filter({"Pod": b, "NodeNames": nodes})["NodeNames"]


def test_with_assumptions_off_prioritize_holds_nothing(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    replica.cache.assumptions.expiry_s = 0
    [a] = seeded(fake, replica, names=("a",))
    assert sorted(scores(replica.extender, a, nodes).values())[-2:] == [9, 10]  # still one
    # node alone at the top
    assert a["metadata"]["uid"] not in replica.cache.state.allocations
    assert outcome(replica.extender, "made") == 0


def test_a_replicas_concurrent_binds_on_one_node_lose_no_write_to_each_other(
        fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 1, 8)
    pods = [fake.seed("pods", pod_obj(f"p{k}", {"gpupool.io/gpu": "1"})) for k in range(8)]
    replica = Replica(fake)
    errors: list[str] = []
    try:
        threads = [threading.Thread(target=lambda pod=pod: errors.append(
            replica.extender.bind(bind_body(pod, nodes[0]))["Error"])) for pod in pods]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert errors == [""] * 8
        assert replica.extender.metrics.conflicts._value.get() == 0  # none lost a race
        assert replica.extender.binder is not None
        assert replica.extender.binder.writes.batches.turns.held() == 0  # all let go
        assert len(fake.get("gpuledgers", nodes[0])["spec"]["entries"]) == 8
    finally:
        replica.close()


def test_no_body_holds_room_for_a_pod_bind_could_not_act_on(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    foreign = pod_obj("foreign", TWO)
    foreign["spec"]["schedulerName"] = "default-scheduler"
    foreign = fake.seed("pods", foreign)
    assert wait_for(lambda: foreign["metadata"]["uid"] in replica.cache.unbound)
    ghost = pod_obj("ghost", TWO)  # never created
    ghost["metadata"]["uid"] = "ghost"
    for pod in (foreign, ghost):
        assert replica.extender.filter({"Pod": pod, "NodeNames": [nodes[0]]})["NodeNames"]
        assert pod["metadata"]["uid"] not in replica.cache.state.allocations
    assert outcome(replica.extender, "made") == 0
