"""QuotaLedger shards: a scope's entries spread over several objects once its head is
full, and the quota stays exact: replicas racing at the limit never over-admit, an old
single-object ledger is read and moved, pruning reaches every shard, and a shard that
cannot be read refuses the scope's binds and changes nothing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer
from waiting import wait_for

from gpupool.core.allocation import Allocation, Slice
from gpupool.extender.bind.reconcile import LedgerReconciler
from gpupool.extender.state.ledger import Entry, decode_entry
from gpupool.extender.tenancy.quotaledger import QuotaLedgers
from gpupool.extender.tenancy.quotashards import PREFIX, shard_name
from gpupool.kube.api import KubeApi

from .builders import Replica, now_rfc3339, pod_obj, schedule, seed_cluster

ONE_GPU = {"gpupool.io/gpu": "1"}


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


def quota(fake: FakeApiServer, name: str, gpus: int) -> None:
    fake.seed("tenantquotas", {"metadata": {"name": name},
                               "spec": {"namespaces": [name], "limits": {"gpus": gpus}}})


def ledger_entries(fake: FakeApiServer) -> dict[str, set[str]]:
    return {o["metadata"]["name"]: set(o["spec"].get("entries") or {})
            for o in fake.objects("quotaledgers")}


def every_entry(fake: FakeApiServer) -> set[str]:
    return set().union(*ledger_entries(fake).values())


def bound_in(fake: FakeApiServer, namespace: str) -> set[str]:
    return {p["metadata"]["uid"] for p in fake.objects("pods")
            if p["metadata"]["namespace"] == namespace and p["spec"].get("nodeName")}


def small_heads(*replicas: Replica, move_at: int = 3) -> None:
    for r in replicas:
        r.extender.binder.quotas.ledgers.move_at = move_at


def ready(r: Replica, pods: int) -> bool:
    return len(r.cache.catalogue.tenants) == 1 and len(r.cache.pods) >= pods


def test_two_replicas_racing_at_the_limit_across_shards_never_exceed_the_quota(
        fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 8, 4)
    quota(fake, "t", 10)
    pods = [fake.seed("pods", pod_obj(f"p{k}", ONE_GPU, ns="t", cpu="100m")) for k in range(36)]
    replicas = [Replica(fake, seed=1), Replica(fake, seed=2)]
    small_heads(*replicas)
    outcome: dict[str, str] = {}

    def run(r: Replica, mine: list[dict[str, Any]], order: list[str]) -> None:
        for pod in mine:
            outcome[pod["metadata"]["name"]] = schedule(r.extender, pod, order)[1]
    try:
        for r in replicas:
            assert wait_for(lambda r=r: ready(r, 36))
            r.feeds.stop(timeout_s=30.0)  # neither sees the other's binds: only the ledger
        threads = [threading.Thread(target=run, args=(r, pods[k::2], nodes[k::2]))
                   for k, r in enumerate(replicas)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for r in replicas:
            r.close()
    bound = bound_in(fake, "t")
    assert len(bound) == 10, outcome
    assert every_entry(fake) == bound
    shards = [n for n in ledger_entries(fake) if n.startswith(PREFIX)]
    assert shards, "the head never moved its entries: the test did not exercise shards"
    assert set(fake.get("quotaledgers", "tenant.t")["spec"]["shards"]) == set(shards)
    refusals = [e for e in outcome.values() if e]
    assert len(refusals) == 26
    assert all("quota of tenant t exceeded" in e or "kept changing" in e for e in refusals)


def old_entry(k: int, node: str) -> dict[str, Any]:
    alloc = Allocation(f"old-{k}", node, 0, 0,
                       (Slice(f"GPU-{node}-{k}", k, 40960, 100, "main"),), exclusive=True)
    return Entry(alloc, f"t/old-{k}", now_rfc3339(), "t").to_json()


def test_an_old_single_object_ledger_is_read_and_moved_to_a_shard_and_still_counts(
        fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 2, 4)
    quota(fake, "t", 6)
    old = {f"old-{k}": old_entry(k, nodes[1]) for k in range(5)}  # binds another replica made
    fake.seed("quotaledgers", {"apiVersion": "gpupool.io/v1alpha1", "kind": "QuotaLedger",
                               "metadata": {"name": "tenant.t"},
                               "spec": {"scope": "tenant t", "entries": old}})
    one, two = (fake.seed("pods", pod_obj(n, ONE_GPU, ns="t")) for n in ("one", "two"))
    r = Replica(fake)
    small_heads(r)
    try:
        assert wait_for(lambda: ready(r, 2))
        assert schedule(r.extender, one, nodes[:1])[1] == ""  # the sixth GPU of six
        moved = ledger_entries(fake)
        late = schedule(r.extender, two, nodes[:1])[1]
    finally:
        r.close()
    assert moved["tenant.t"] == set()
    assert moved[shard_name("tenant.t", 0)] == {*old, one["metadata"]["uid"]}
    assert "quota of tenant t exceeded: 1 GPUs asked, 6 of 6 in use, 0 left" in late


def test_pruning_removes_the_entries_of_pods_seen_bound_from_every_shard(
        fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 2, 4)
    quota(fake, "t", 8)
    pods = [fake.seed("pods", pod_obj(f"p{k}", ONE_GPU, ns="t")) for k in range(8)]
    now = [1_000_000.0]
    r = Replica(fake, clock=lambda: now[0])
    small_heads(r, move_at=2)
    try:
        assert wait_for(lambda: ready(r, 8))
        for pod in pods:
            assert schedule(r.extender, pod, nodes)[1] == ""
        uids = {p["metadata"]["uid"] for p in pods}
        assert every_entry(fake) == uids
        assert len([n for n in ledger_entries(fake) if n.startswith(PREFIX)]) >= 1
        assert wait_for(lambda: all(r.cache.pods[u].node for u in uids))
        now[0] += 61.0  # past the pending grace: every replica's watch has shown them
        done = LedgerReconciler(r.cache, r.api).run_once()
    finally:
        r.close()
    assert done.quota_pruned == 8
    assert all(not e for e in ledger_entries(fake).values())


def test_a_shard_that_does_not_decode_refuses_the_scopes_binds_and_changes_nothing(
        fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 1, 8)
    quota(fake, "t", 8)
    pods = [fake.seed("pods", pod_obj(f"p{k}", ONE_GPU, ns="t")) for k in range(4)]
    r = Replica(fake)
    small_heads(r, move_at=2)
    try:
        assert wait_for(lambda: ready(r, 4))
        for pod in pods[:3]:
            assert schedule(r.extender, pod, nodes)[1] == ""
        shard = shard_name("tenant.t", 0)
        victim = sorted(fake.get("quotaledgers", shard)["spec"]["entries"])[0]
        fake.patch("quotaledgers", shard, {"spec": {"entries": {victim: {
            "allocation": "{not json", "pod": "t/x"}}}})
        r.extender.binder.quotas.ledgers.forget(shard)  # as another replica would read it
        before = (ledger_entries(fake), {o["metadata"]["name"]: o["spec"].get("entries")
                                         for o in fake.objects("gpuledgers")})
        error = schedule(r.extender, pods[3], nodes)[1]
        after = (ledger_entries(fake), {o["metadata"]["name"]: o["spec"].get("entries")
                                        for o in fake.objects("gpuledgers")})
    finally:
        r.close()
    assert "the quota of tenant t cannot be checked for t/p3" in error
    assert f"QuotaLedger {shard}" in error and victim in error
    assert after == before
    assert pods[3]["metadata"]["uid"] not in bound_in(fake, "t")


def test_a_shard_name_is_never_the_name_of_a_scopes_ledger() -> None:
    assert shard_name("tenant.team-a", 0) == "shard-0.tenant.team-a"
    long = shard_name("cohort." + "x" * 250, 3)
    assert long.startswith("shard-3.h-") and len(long) <= 253
    assert not any(shard_name("tenant.a", k).startswith(("tenant.", "cohort.", "group.",
                                                           "namespace.")) for k in range(3))


def test_a_head_deleted_by_hand_is_recreated_and_its_left_over_shard_takes_the_next_move(
        fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 1, 8)
    quota(fake, "t", 8)
    pods = [fake.seed("pods", pod_obj(f"p{k}", ONE_GPU, ns="t")) for k in range(5)]
    r = Replica(fake)
    small_heads(r, move_at=2)
    try:
        assert wait_for(lambda: ready(r, 5))
        for pod in pods[:2]:
            assert schedule(r.extender, pod, nodes)[1] == ""
        shard = shard_name("tenant.t", 0)
        assert ledger_entries(fake)[shard] == {p["metadata"]["uid"] for p in pods[:2]}
        fake.delete("quotaledgers", "tenant.t")  # an operator cleans up, or a restore
        errors = [schedule(r.extender, pod, nodes)[1] for pod in pods[2:]]
    finally:
        r.close()
    assert errors == ["", "", ""]
    assert ledger_entries(fake)[shard] >= {p["metadata"]["uid"] for p in pods[2:4]}
    assert fake.get("quotaledgers", "tenant.t")["spec"]["shards"] == {shard: 2}


def test_a_rolled_back_charge_leaves_the_shard_it_was_moved_to(fake: FakeApiServer) -> None:
    api = KubeApi.connect(server=fake.url)
    try:
        ledgers = QuotaLedgers(api, move_at=1)
        written = ledgers.commit(ledgers.known("tenant.t"), "tenant t", "u1",
                                 decode_entry("u1", old_entry(1, "n0")))
        ledgers.spread(written, "tenant t")
        assert ledger_entries(fake) == {"tenant.t": set(), shard_name("tenant.t", 0): {"u1"}}
        ledgers.remove("tenant.t", "u1")  # a later scope refused the bind
    finally:
        api.close()
    assert every_entry(fake) == set()
