"""Priorities inside a tenant's quota and reclaim of lent capacity, carried out by the
extender's preemption over the FAKE API server (the Eviction API, holds in GPULedgers)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.extender.preemption.plans import PreemptionSettings
from tests.waiting import wait_for

from .builders import Replica, pod_obj, schedule, seed_cluster

FAST = PreemptionSettings(hold_s=60.0, retry_s=0.0)
ONE = {"gpupool.io/gpu": "1"}


@pytest.fixture
def nodes(fake: FakeApiServer) -> list[str]:
    return seed_cluster(fake, 2, 4)  # 8 GPUs: room is never what is short


@pytest.fixture
def replica(fake: FakeApiServer, nodes: list[str]) -> Iterator[Replica]:
    r = Replica(fake, preemption=FAST)
    assert wait_for(lambda: "budgets" in r.cache.synced)
    yield r
    r.close()


def quota(fake: FakeApiServer, r: Replica, name: str, namespaces: list[str], gpus: int,
          **spec: Any) -> None:
    fake.seed("tenantquotas", {"metadata": {"name": name}, "spec": {
        "namespaces": namespaces, "limits": {"gpus": gpus}, **spec}})
    assert wait_for(lambda: name in r.cache.catalogue.tenants.by_name)


def run(fake: FakeApiServer, r: Replica, nodes: list[str], name: str, ns: str,
        priority: int = 0) -> dict[str, Any]:
    pod = pod_obj(name, ONE, ns=ns)
    pod["spec"]["priority"] = priority
    pod = fake.seed("pods", pod)
    assert wait_for(lambda: pod["metadata"]["uid"] in r.cache.unbound)
    assert schedule(r.extender, pod, nodes)[1] == ""
    assert wait_for(lambda: r.cache.pods[pod["metadata"]["uid"]].decision is not None)
    return pod


def pending(fake: FakeApiServer, r: Replica, name: str, ns: str, priority: int
            ) -> dict[str, Any]:
    pod = pod_obj(name, ONE, ns=ns)
    pod["spec"]["priority"] = priority
    pod = fake.seed("pods", pod)
    assert wait_for(lambda: pod["metadata"]["uid"] in r.cache.unbound)
    return pod


def settled(r: Replica) -> bool:
    """No plan is being made (on the planner thread) or carried out."""
    preemptor = r.extender.preemptor
    assert preemptor is not None
    return wait_for(lambda: not preemptor.planning and not preemptor.inflight)


def alive(fake: FakeApiServer, pod: dict[str, Any]) -> bool:
    meta = pod["metadata"]
    return fake.get("pods", meta["name"], meta["namespace"]) is not None


def test_a_higher_priority_pod_preempts_its_own_tenants_lowest_priority_pod_not_others(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    quota(fake, replica, "team-a", ["a", "a-dev"], 2)
    low = run(fake, replica, nodes, "low", "a-dev", priority=10)
    mid = run(fake, replica, nodes, "mid", "a", priority=50)
    other = run(fake, replica, nodes, "other", "b", priority=0)  # another tenant, lower
    urgent = pending(fake, replica, "urgent", "a", 100)
    answer = replica.extender.filter({"Pod": urgent, "NodeNames": nodes})
    assert answer["NodeNames"] == []  # the plain reasons: the plan is made on its thread
    assert all("quota of tenant team-a exceeded" in v for v in answer["FailedNodes"].values())
    assert settled(replica)
    counted = samples(replica, "gpupool_extender_tenant_preemptions_total")
    assert counted == {("team-a", "priority"): 1}
    assert not alive(fake, low) and alive(fake, mid) and alive(fake, other)
    assert wait_for(lambda: low["metadata"]["uid"] not in replica.cache.pods)
    assert schedule(replica.extender, urgent, nodes)[1] == ""


def test_a_pod_of_no_higher_priority_waits_and_nobody_is_evicted(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    quota(fake, replica, "team-a", ["a"], 1)
    low = run(fake, replica, nodes, "low", "a", priority=10)
    same = pending(fake, replica, "same", "a", 10)
    answer = replica.extender.filter({"Pod": same, "NodeNames": nodes})
    assert answer["NodeNames"] == []
    assert all("quota of tenant team-a exceeded" in v for v in answer["FailedNodes"].values())
    assert settled(replica) and alive(fake, low)
    assert not [p for m, p in fake.requests if m == "POST" and p.endswith("/eviction")]


def test_a_lender_takes_back_what_its_cohort_borrowed_whatever_the_priorities(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    quota(fake, replica, "lender", ["l"], 2, cohort="lab")
    quota(fake, replica, "borrower", ["b"], 1, cohort="lab")
    mine = run(fake, replica, nodes, "mine", "l")
    first = run(fake, replica, nodes, "first", "b", priority=1000)
    borrowed = run(fake, replica, nodes, "borrowed", "b", priority=1000)  # beyond its 1
    back = pending(fake, replica, "back", "l", 0)
    answer = replica.extender.filter({"Pod": back, "NodeNames": nodes})
    assert answer["NodeNames"] == []
    assert settled(replica)
    counted = samples(replica, "gpupool_extender_tenant_preemptions_total")
    assert counted == {("lender", "reclaim"): 1}
    assert alive(fake, mine) and alive(fake, first) and not alive(fake, borrowed)
    assert wait_for(lambda: borrowed["metadata"]["uid"] not in replica.cache.pods)
    assert schedule(replica.extender, back, nodes)[1] == ""


def samples(r: Replica, name: str) -> dict[tuple[str, ...], float]:
    found: dict[tuple[str, ...], float] = {}
    for family in r.extender.metrics.registry.collect():
        for s in family.samples:
            if s.name == name:
                found[tuple(s.labels.values())] = s.value
    return found


def test_metrics_show_nominal_used_borrowed_lent_pending_and_preemptions_per_tenant(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    quota(fake, replica, "lender", ["l"], 3, cohort="lab")
    quota(fake, replica, "borrower", ["b"], 1, cohort="lab", classes={"x": {"gpus": 5}})
    run(fake, replica, nodes, "mine", "l")
    run(fake, replica, nodes, "first", "b")
    run(fake, replica, nodes, "second", "b")
    pending(fake, replica, "waiting", "b", 0)
    tenant = samples(replica, "gpupool_tenant_quota")
    assert tenant["lender", "gpus", "nominal"] == 3 and tenant["lender", "gpus", "used"] == 1
    assert tenant["borrower", "gpus", "used"] == 2
    assert tenant["borrower", "gpus", "borrowed"] == 1
    assert tenant["lender", "gpus", "lent"] == 1 and tenant["borrower", "gpus", "lent"] == 0
    assert ("lender", "memory_mib", "nominal") not in tenant  # not limited
    assert samples(replica, "gpupool_tenant_class_quota")["borrower", "x", "gpus",
                                                           "nominal"] == 5
    assert samples(replica, "gpupool_tenant_pending_pods") == {("borrower",): 1}
    back = pending(fake, replica, "back", "l", 0)
    run(fake, replica, nodes, "third", "b")  # the cohort lends all 2 idle GPUs of lender
    replica.extender.filter({"Pod": back, "NodeNames": nodes})
    assert settled(replica)
    counted = samples(replica, "gpupool_extender_tenant_preemptions_total")
    assert counted == {("lender", "reclaim"): 1}
