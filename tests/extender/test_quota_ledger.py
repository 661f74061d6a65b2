"""QuotaLedgers make a tenant's quota exact across extender replicas: binds racing through
two replicas never take a quota past its limit, a refused charge leaves no GPULedger
entry, and a bind that dies between its writes leaves nothing that is never cleaned."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer
from waiting import wait_for

from gpupool.core.quota import Amount, Charge, Limit
from gpupool.core.tenants import TenantQuota
from gpupool.extender.bind.reconcile import LedgerReconciler
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.tenancy.quotaledger import ledger_name, scopes_of
from gpupool.kube.errors import NotFound
from tests.rbac_grants import grants, manifest, needed, refused, writes

from .builders import Replica, pod_obj, schedule, seed_cluster

ONE_GPU = {"gpupool.io/gpu": "1"}


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


def quota(fake: FakeApiServer, name: str, gpus: int, cohort: str | None = None) -> None:
    spec: dict[str, Any] = {"namespaces": [name], "limits": {"gpus": gpus}}
    if cohort:
        spec["cohort"] = cohort
    fake.seed("tenantquotas", {"metadata": {"name": name}, "spec": spec})


def bound_in(fake: FakeApiServer, namespace: str) -> set[str]:
    return {p["metadata"]["uid"] for p in fake.objects("pods")
            if p["metadata"]["namespace"] == namespace and p["spec"].get("nodeName")}


def entries(fake: FakeApiServer, kind: str) -> dict[str, set[str]]:
    return {o["metadata"]["name"]: set(o["spec"].get("entries") or {})
            for o in fake.objects(kind)}


def ready(replica: Replica, quotas: int, pods: int) -> bool:
    return len(replica.cache.catalogue.tenants) == quotas and len(replica.cache.pods) >= pods


def test_two_replicas_racing_over_40_pods_of_a_tenant_never_exceed_its_quota(
        fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 8, 4)  # 32 GPUs: room is never what stops them
    quota(fake, "t", 6)
    pods = [fake.seed("pods", pod_obj(f"p{k}", ONE_GPU, ns="t", cpu="100m")) for k in range(40)]
    replicas = [Replica(fake, seed=1), Replica(fake, seed=2)]
    outcome: dict[str, str] = {}

    def run(r: Replica, mine: list[dict[str, Any]], order: list[str]) -> None:
        for pod in mine:
            outcome[pod["metadata"]["name"]] = schedule(r.extender, pod, order)[1]
    try:
        for r in replicas:
            assert wait_for(lambda r=r: ready(r, 1, 40))
            r.feeds.stop(timeout_s=30.0)  # the worst watch lag: neither sees the other's binds
        threads = [threading.Thread(target=run, args=(r, pods[k::2], nodes[k::2]))
                   for k, r in enumerate(replicas)]  # each replica binds on its own nodes
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for r in replicas:
            r.close()
    bound = bound_in(fake, "t")
    assert len(bound) == 6, outcome
    assert entries(fake, "quotaledgers") == {"tenant.t": bound}
    refusals = [e for e in outcome.values() if e]
    assert len(refusals) == 34
    assert all("quota of tenant t exceeded" in e or "kept changing" in e for e in refusals)


def test_a_charge_the_quota_refuses_leaves_no_entry_in_the_nodes_gpu_ledger(
        fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 2, 2)
    quota(fake, "t", 1)
    one = fake.seed("pods", pod_obj("one", ONE_GPU, ns="t"))
    two = fake.seed("pods", pod_obj("two", ONE_GPU, ns="t"))
    a, b = Replica(fake), Replica(fake)
    try:
        for r in (a, b):
            assert wait_for(lambda r=r: ready(r, 1, 2))
        b.feeds.stop(timeout_s=30.0)  # b has not seen a's bind
        assert schedule(a.extender, one, nodes[:1])[1] == ""
        error = schedule(b.extender, two, nodes[1:])[1]
    finally:
        a.close()
        b.close()
    assert "quota of tenant t exceeded: 1 GPUs asked, 1 of 1 in use, 0 left" in error
    assert entries(fake, "gpuledgers") == {nodes[0]: {one["metadata"]["uid"]}, nodes[1]: set()}
    assert entries(fake, "quotaledgers") == {"tenant.t": {one["metadata"]["uid"]}}


def test_a_pod_under_no_quota_touches_no_quota_ledger(fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 1, 2)
    quota(fake, "t", 1)
    pod = fake.seed("pods", pod_obj("free", ONE_GPU, ns="elsewhere"))
    r = Replica(fake)
    try:
        assert wait_for(lambda: ready(r, 1, 1))
        assert schedule(r.extender, pod, nodes)[1] == ""
    finally:
        r.close()
    assert not [p for _, p in fake.requests if "quotaledgers" in p]


class Crash(Exception):
    """The extender dies here (nothing after it runs, no roll back)."""


@pytest.mark.parametrize("where", ["before the quota write", "before the Binding"])
def test_a_bind_that_dies_between_its_writes_leaves_nothing_that_is_never_cleaned(
        fake: FakeApiServer, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    nodes = seed_cluster(fake, 1, 2)
    quota(fake, "t", 1)
    first = fake.seed("pods", pod_obj("first", ONE_GPU, ns="t"))
    later = fake.seed("pods", pod_obj("later", ONE_GPU, ns="t"))
    now = [1_000_000.0]
    r, survivor = Replica(fake, clock=lambda: now[0]), Replica(fake, clock=lambda: now[0])
    try:
        for replica in (r, survivor):
            assert wait_for(lambda replica=replica: ready(replica, 1, 2))
        target: Any = r.extender.binder.quotas if where.endswith("write") else r.api
        name = "admit" if where.endswith("write") else "bind_pod"
        with monkeypatch.context() as m:
            m.setattr(target, name, lambda *a, **k: (_ for _ in ()).throw(Crash(where)))
            with pytest.raises(Crash):
                schedule(r.extender, first, nodes)
        r.close()  # it died: what it held in memory is gone with it
        quota_left = where.endswith("Binding")
        assert entries(fake, "quotaledgers") == ({"tenant.t": {first["metadata"]["uid"]}}
                                                 if quota_left else {})
        assert wait_for(lambda: first["metadata"]["uid"] in survivor.cache.entry_node)
        now[0] += 61.0  # past the pending grace: the pod is still pending, unbound
        done = LedgerReconciler(survivor.cache, survivor.api).run_once()
        assert (done.pruned, done.quota_pruned) == (1, 1 if quota_left else 0)
        assert all(not e for e in entries(fake, "gpuledgers").values())
        assert all(not e for e in entries(fake, "quotaledgers").values())
        assert schedule(survivor.extender, later, nodes)[1] == ""  # the quota is free again
    finally:
        r.close()
        survivor.close()
    calls = needed(fake.requests)  # the shipped role allows every QuotaLedger call made
    assert ("gpupool.io", "quotaledgers") in writes(calls)
    assert refused(calls, grants(manifest("extender", "rbac.yaml"), "gpupool-extender")) == set()


def test_a_cohort_is_one_scope_and_a_limited_group_another() -> None:
    cache = ClusterCache()
    cache.catalogue.tenants.put(TenantQuota("a", frozenset({"ns-a"}), Limit(gpus=2),
                                            cohort="shared"))
    cache.catalogue.tenants.put(TenantQuota("b", frozenset({"ns-b"}), Limit(gpus=2)))
    cache.catalogue.quotas.set_group_limit("g", Limit(gpus=4))
    one = Amount(1, 40960, 100)
    assert scopes_of(cache, Charge(one, "ns-a", None, "g")) == {
        "cohort.shared": "cohort shared", "group.g": "group g"}
    assert scopes_of(cache, Charge(one, "ns-b")) == {"tenant.b": "tenant b"}
    assert scopes_of(cache, Charge(one, "ns-c", None, "other")) == {}


def test_a_scope_name_that_is_no_valid_object_name_is_hashed() -> None:
    assert ledger_name("tenant", "team-a") == "tenant.team-a"
    hashed = ledger_name("cohort", "Research Pool")
    assert hashed.startswith("cohort.h-") and len(hashed) == len("cohort.h-") + 40
    assert ledger_name("group", "x" * 300) != ledger_name("group", "x" * 301)


def test_a_cohort_is_exact_across_replicas_too(fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 2, 4)
    quota(fake, "a", 1, cohort="c")
    quota(fake, "b", 1, cohort="c")  # the cohort's pool: 2 GPUs
    a1, a2 = (fake.seed("pods", pod_obj(f"a{k}", ONE_GPU, ns="a")) for k in (1, 2))
    b1 = fake.seed("pods", pod_obj("b1", ONE_GPU, ns="b"))
    x, y = Replica(fake), Replica(fake)
    try:
        for r in (x, y):
            assert wait_for(lambda r=r: ready(r, 2, 3))
        y.feeds.stop(timeout_s=30.0)  # y has not seen x's binds
        assert schedule(x.extender, a1, nodes[:1])[1] == ""
        assert schedule(x.extender, a2, nodes[:1])[1] == ""  # borrows b's idle GPU
        error = schedule(y.extender, b1, nodes[1:])[1]
    finally:
        x.close()
        y.close()
    assert error, "the cohort holds 3 GPUs of a pool of 2"
    assert "tenant b" in error
    assert entries(fake, "quotaledgers") == {"cohort.c": {a1["metadata"]["uid"],
                                                          a2["metadata"]["uid"]}}


def test_a_quota_ledger_the_api_server_does_not_serve_refuses_the_bind_and_says_why(
        fake: FakeApiServer, monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = seed_cluster(fake, 1, 2)
    quota(fake, "t", 1)
    pod = fake.seed("pods", pod_obj("one", ONE_GPU, ns="t"))
    r = Replica(fake)
    try:
        assert wait_for(lambda: ready(r, 1, 1))

        def absent(*_: Any) -> Any:
            raise NotFound("the server could not find the requested resource")
        monkeypatch.setattr(r.api, "get_quota_ledger", absent)
        monkeypatch.setattr(r.api, "create_quota_ledger", absent)
        error = schedule(r.extender, pod, nodes)[1]
    finally:
        r.close()
    assert "QuotaLedger tenant.t failed" in error and "quotaledgers.yaml" in error
    assert entries(fake, "gpuledgers") == {nodes[0]: set()}
    assert not any(p["spec"].get("nodeName") for p in fake.objects("pods"))


def test_a_ledger_keeps_only_the_binds_others_may_not_have_seen_and_the_quota_still_holds(
        fake: FakeApiServer) -> None:
    """The ledger carries only recent binds (else a cohort's one object would outgrow
    what the API server stores); older pods are charged from the pods themselves."""
    nodes = seed_cluster(fake, 1, 4)
    quota(fake, "t", 1)
    first = fake.seed("pods", pod_obj("first", ONE_GPU, ns="t"))
    later = fake.seed("pods", pod_obj("later", ONE_GPU, ns="t"))
    uid = first["metadata"]["uid"]
    now = [1_000_000.0]
    r = Replica(fake, clock=lambda: now[0])
    try:
        assert wait_for(lambda: ready(r, 1, 2))
        assert schedule(r.extender, first, nodes)[1] == ""
        assert entries(fake, "quotaledgers") == {"tenant.t": {uid}}
        assert wait_for(lambda: (r.cache.pods.get(uid) is not None and
                                 bool(r.cache.pods[uid].node)))
        done = LedgerReconciler(r.cache, r.api).run_once()
        assert done.quota_pruned == 0  # bound moments ago: others may not have seen it
        now[0] += 61.0  # past the pending grace, the pod seen bound where the entry says
        done = LedgerReconciler(r.cache, r.api).run_once()
        assert done.quota_pruned == 1 and entries(fake, "quotaledgers") == {"tenant.t": set()}
        late = schedule(r.extender, later, nodes)[1]
        assert "quota of tenant t exceeded" in late  # counted from the pod itself
    finally:
        r.close()


@pytest.mark.parametrize("shared", [True, False], ids=["the binder's ledgers", "its own"])
def test_a_reconciler_sharing_the_binders_ledgers_spares_the_next_bind_a_conflict(
        fake: FakeApiServer, shared: bool) -> None:
    nodes = seed_cluster(fake, 1, 4)
    quota(fake, "t", 2)
    first = fake.seed("pods", pod_obj("first", ONE_GPU, ns="t"))
    later = fake.seed("pods", pod_obj("later", ONE_GPU, ns="t"))
    uid = first["metadata"]["uid"]
    now = [1_000_000.0]
    r = Replica(fake, clock=lambda: now[0])
    try:
        assert wait_for(lambda: ready(r, 1, 2))
        assert schedule(r.extender, first, nodes)[1] == ""
        assert wait_for(lambda: (r.cache.pods.get(uid) is not None and
                                 bool(r.cache.pods[uid].node)))
        now[0] += 61.0
        binder = r.extender.binder
        assert binder is not None
        own = LedgerReconciler(r.cache, r.api,
                               quota_ledgers=binder.quotas.ledgers if shared else None)
        assert own.run_once().quota_pruned == 1
        before = r.extender.metrics.conflicts._value.get()
        assert schedule(r.extender, later, nodes)[1] == ""
        conflicts = r.extender.metrics.conflicts._value.get() - before
        assert conflicts == (0 if shared else 1)
    finally:
        r.close()
