"""Fair share in a cohort, enforced by the extender's filter (FAKE API server over loopback,
the real client and informers): borrowers of weights 1 and 3 split what the cohort lends
1:3 while both wait, and one alone takes all of it."""

from __future__ import annotations

from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.core.reasons import for_scheduler
from gpupool.extender.preemption.plans import PreemptionSettings
from tests.waiting import wait_for

from .builders import Replica, pod_obj, schedule, seed_cluster

ONE = {"gpupool.io/gpu": "1"}
FAIR_B = ("fair share of tenant team-b in cohort research reached: 1 GPUs asked, 1 of 1 "
          "borrowed (weight 1 of 4), wait or raise the weight")


@pytest.fixture
def nodes(fake: FakeApiServer) -> list[str]:
    return seed_cluster(fake, 2, 4)  # 8 GPUs: room on the nodes is never what is short


def cohort(fake: FakeApiServer, r: Replica, fair: bool = True) -> None:
    """team-a lends its 4 GPUs; team-b (weight 1) and team-c (weight 3) have none."""
    for name, gpus, weight in (("team-a", 4, 1), ("team-b", 0, 1), ("team-c", 0, 3)):
        spec: dict[str, Any] = {"namespaces": [name[-1]], "limits": {"gpus": gpus},
                                "cohort": "research", "weight": weight}
        if fair:
            spec["fairSharing"] = True
        fake.seed("tenantquotas", {"metadata": {"name": name}, "spec": spec})
    assert wait_for(lambda: len(r.cache.catalogue.tenants) == 3)


def waiting(fake: FakeApiServer, r: Replica, nodes: list[str], ns: str, count: int
            ) -> list[dict[str, Any]]:
    """``count`` pending pods of ``ns``, each filtered once (as kube-scheduler tries them)."""
    pods = [fake.seed("pods", pod_obj(f"{ns}{k}", ONE, ns=ns)) for k in range(count)]
    assert wait_for(lambda: all(p["metadata"]["uid"] in r.cache.unbound for p in pods))
    for p in pods:
        r.extender.filter({"Pod": p, "NodeNames": nodes})
    return pods


def reasons(answer: dict[str, Any]) -> set[str]:
    return {r.removeprefix("gpupool: ") for r in (*answer["FailedNodes"].values(),
                                                  *answer["FailedAndUnresolvableNodes"].values())}


def test_borrowers_of_weights_1_and_3_split_what_the_cohort_lends_1_to_3(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    r = replica
    cohort(fake, r)
    b = waiting(fake, r, nodes, "b", 4)
    c = waiting(fake, r, nodes, "c", 4)
    assert schedule(r.extender, b[0], nodes)[1] == ""
    assert schedule(r.extender, c[0], nodes)[1] == ""
    answer = r.extender.filter({"Pod": b[1], "NodeNames": nodes})
    assert answer["NodeNames"] == []
    assert reasons(answer) == {FAIR_B}
    assert set(answer["FailedNodes"]) == set(nodes)  # not permanent: it waits
    assert for_scheduler(FAIR_B) == FAIR_B
    assert schedule(r.extender, c[1], nodes)[1] == ""
    assert schedule(r.extender, c[2], nodes)[1] == ""
    _, why = schedule(r.extender, c[3], nodes)
    assert "tenant team-c (cohort research) cannot borrow" in why  # the cohort lent all
    held = {ns: r.cache.catalogue.tenants.used(
        r.cache.catalogue.quotas, r.cache.catalogue.tenants.by_name[f"team-{ns}"]).gpus
        for ns in "abc"}
    assert held == {"a": 0, "b": 1, "c": 3}


def test_a_borrower_nobody_competes_with_takes_all_the_cohort_lends(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    r = replica
    cohort(fake, r)
    b = waiting(fake, r, nodes, "b", 5)
    for pod in b[:4]:
        assert schedule(r.extender, pod, nodes)[1] == ""  # team-c asks nothing
    _, why = schedule(r.extender, b[4], nodes)
    assert why.startswith("gpupool: tenant team-b (cohort research) cannot borrow: 1 GPUs "
                          "asked, 4 of its nominal 0 in use, and cohort research lends 4")


def test_a_pod_that_no_longer_waits_no_longer_counts_for_its_tenant(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    r = replica
    cohort(fake, r)
    b = waiting(fake, r, nodes, "b", 3)
    c = waiting(fake, r, nodes, "c", 3)  # wants 3: team-b's share of 4 is 1
    assert schedule(r.extender, b[0], nodes)[1] == ""
    assert reasons(r.extender.filter({"Pod": b[1], "NodeNames": nodes})) == {FAIR_B}
    gone(fake, r, c[0])  # team-c wants 2: team-b's share is 2
    assert schedule(r.extender, b[1], nodes)[1] == ""
    assert reasons(r.extender.filter({"Pod": b[2], "NodeNames": nodes})) == {
        "fair share of tenant team-b in cohort research reached: 1 GPUs asked, 2 of 2 "
        "borrowed (weight 1 of 4), wait or raise the weight"}
    gone(fake, r, c[1])
    gone(fake, r, c[2])  # nobody else waits: team-b may take what is lent
    assert schedule(r.extender, b[2], nodes)[1] == ""


def gone(fake: FakeApiServer, r: Replica, pod: dict[str, Any]) -> None:
    meta = pod["metadata"]
    fake.delete("pods", meta["name"], meta["namespace"])
    assert wait_for(lambda: meta["uid"] not in r.cache.unbound)


def test_without_fair_sharing_borrowing_is_first_come_first_served(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    r = replica
    cohort(fake, r, fair=False)
    b = waiting(fake, r, nodes, "b", 4)
    waiting(fake, r, nodes, "c", 4)
    for pod in b:
        assert schedule(r.extender, pod, nodes)[1] == ""


def settled(r: Replica) -> bool:
    """No plan is being made (on the planner thread) or carried out."""
    preemptor = r.extender.preemptor
    assert preemptor is not None
    return wait_for(lambda: not preemptor.planning and not preemptor.inflight)


def test_a_tenant_under_its_fair_share_reclaims_from_one_beyond_it(
        fake: FakeApiServer, nodes: list[str]) -> None:
    r = Replica(fake, preemption=PreemptionSettings(hold_s=60.0, retry_s=0.0))
    try:
        assert wait_for(lambda: "budgets" in r.cache.synced)
        cohort(fake, r)
        b = waiting(fake, r, nodes, "b", 4)
        for pod in b:  # nobody else waits: team-b borrows all 4
            assert schedule(r.extender, pod, nodes)[1] == ""
        assert wait_for(lambda: all(r.cache.pods[p["metadata"]["uid"]].decision is not None
                                    for p in b))
        c = fake.seed("pods", pod_obj("c0", ONE, ns="c"))
        assert wait_for(lambda: c["metadata"]["uid"] in r.cache.unbound)
        answer = r.extender.filter({"Pod": c, "NodeNames": nodes})  # shares: c 1, b 3
        assert answer["NodeNames"] == []  # the plain reasons: the plan is made on its thread
        assert r.extender.preemptor is not None
        assert settled(r)
        assert r.extender.preemptor.inflight == {}
        kinds = {tuple(s.labels.values()): s.value
                 for f in r.extender.metrics.registry.collect() for s in f.samples
                 if s.name == "gpupool_extender_tenant_preemptions_total"}
        assert kinds == {("team-c", "reclaim"): 1}
        evicted = [p for p in b if fake.get("pods", p["metadata"]["name"], "b") is None]
        assert len(evicted) == 1  # one GPU was short: one borrowed pod of team-b goes
        assert wait_for(lambda: evicted[0]["metadata"]["uid"] not in r.cache.pods)
        assert schedule(r.extender, c, nodes)[1] == ""
        back = fake.seed("pods", pod_obj("b-again", ONE, ns="b"))  # its job recreates it
        assert wait_for(lambda: back["metadata"]["uid"] in r.cache.unbound)
        (why,) = reasons(r.extender.filter({"Pod": back, "NodeNames": nodes}))
        assert why.startswith("tenant team-b (cohort research) cannot borrow")
        assert settled(r)
        assert fake.get("pods", "c0", "c") is not None  # beyond its share: it takes nothing
    finally:
        r.close()


def test_a_pod_no_sent_node_can_ever_take_does_not_count_as_waiting(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    cohort(fake, replica)
    huge = fake.seed("pods", pod_obj("huge", {"gpupool.io/gpu-memory": "81920"}, ns="c"))
    assert wait_for(lambda: huge["metadata"]["uid"] in replica.cache.unbound)
    answer = replica.extender.filter({"Pod": huge, "NodeNames": nodes})  # GPUs of 40 GiB
    assert set(answer["FailedAndUnresolvableNodes"]) == set(nodes)
    assert huge["metadata"]["uid"] not in replica.cache.catalogue.tenants.waiting.asks
    b = waiting(fake, replica, nodes, "b", 4)
    for pod in b:  # team-c's impossible pod holds nothing idle for team-c
        assert schedule(replica.extender, pod, nodes)[1] == ""
