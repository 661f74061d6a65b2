"""Review of the QuotaLedger: a ledger object deleted (or recreated) under a replica that
remembers it must not refuse binds; a hand-edited spec.node must not redirect writes."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer
from waiting import wait_for

from gpupool.core.allocation import Allocation, Slice
from gpupool.extender.state.ledger import Entry
from gpupool.extender.tenancy.quotaledger import QuotaLedgers
from gpupool.kube.api import KubeApi
from tests.extender.builders import Replica, pod_obj, schedule, seed_cluster

ONE_GPU = {"gpupool.io/gpu": "1"}


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


def quota(fake: FakeApiServer, name: str, gpus: int) -> None:
    spec: dict[str, Any] = {"namespaces": [name], "limits": {"gpus": gpus}}
    fake.seed("tenantquotas", {"metadata": {"name": name}, "spec": spec})


def test_a_bind_after_the_quota_ledger_was_deleted_recreates_it_instead_of_failing(
        fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 1, 4)
    quota(fake, "t", 4)
    one = fake.seed("pods", pod_obj("one", ONE_GPU, ns="t"))
    two = fake.seed("pods", pod_obj("two", ONE_GPU, ns="t"))
    r = Replica(fake)
    try:
        assert wait_for(lambda: len(r.cache.catalogue.tenants) == 1 and len(r.cache.pods) >= 2)
        assert schedule(r.extender, one, nodes)[1] == ""
        fake.delete("quotaledgers", "tenant.t")  # an operator cleans up, or a restore
        error = schedule(r.extender, two, nodes)[1]
    finally:
        r.close()
    assert error == ""
    assert set(fake.get("quotaledgers", "tenant.t")["spec"]["entries"]) == {
        two["metadata"]["uid"]}


def test_a_listed_quota_ledger_is_named_by_its_object_name_not_a_hand_edited_spec_node(
        fake: FakeApiServer) -> None:
    fake.seed("quotaledgers", {"apiVersion": "gpupool.io/v1alpha1", "kind": "QuotaLedger",
                               "metadata": {"name": "tenant.a"},
                               "spec": {"scope": "tenant a", "node": "tenant.b",
                                        "entries": {}}})
    api = KubeApi.connect(server=fake.url)
    try:
        views = QuotaLedgers(api).listed()
    finally:
        api.close()
    assert [v.node for v in views] == ["tenant.a"]


def test_a_quota_ledger_entry_without_a_bind_time_of_a_pod_that_is_gone_stops_counting(
        fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 1, 4)
    quota(fake, "t", 1)
    one = fake.seed("pods", pod_obj("one", ONE_GPU, ns="t"))
    two = fake.seed("pods", pod_obj("two", ONE_GPU, ns="t"))
    r = Replica(fake)
    try:
        assert wait_for(lambda: len(r.cache.catalogue.tenants) == 1 and len(r.cache.pods) >= 2)
        assert schedule(r.extender, one, nodes)[1] == ""
    finally:
        r.close()
    written = fake.get("quotaledgers", "tenant.t")["spec"]["entries"][one["metadata"]["uid"]]
    restored = {k: v for k, v in written.items() if k != "bindTime"}  # the CRD allows it
    fake.patch("quotaledgers", "tenant.t", {"spec": {"entries": {
        one["metadata"]["uid"]: None, "0e6f1c9e-gone-pod": restored}}})
    fake.delete("pods", "one", "t")
    fake.patch("gpuledgers", nodes[0], {"spec": {"entries": {one["metadata"]["uid"]: None}}})
    r = Replica(fake)
    try:
        assert wait_for(lambda: len(r.cache.catalogue.tenants) == 1 and len(r.cache.pods) >= 1)
        error = schedule(r.extender, two, nodes)[1]
    finally:
        r.close()
    assert error == ""


def in_flight_entry(uid: str, node: str, namespace: str, name: str) -> dict[str, object]:
    """A QuotaLedger entry as another replica's bind in flight writes it (bound just now)."""
    alloc = Allocation(uid, node, 100, 64, (Slice(f"GPU-{node}-0", 0, 40960, 100, "c0"),),
                       exclusive=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return Entry(alloc, f"{namespace}/{name}", stamp, namespace).to_json()


def test_a_refusal_does_not_keep_counting_an_entry_another_replica_has_since_rolled_back(
        fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 1, 4)
    quota(fake, "t", 1)
    other = fake.seed("pods", pod_obj("other", ONE_GPU, ns="t"))
    mine = fake.seed("pods", pod_obj("mine", ONE_GPU, ns="t"))
    r = Replica(fake)
    try:
        assert wait_for(lambda: len(r.cache.catalogue.tenants) == 1 and len(r.cache.pods) >= 2)
        uid = other["metadata"]["uid"]
        fake.seed("quotaledgers", {"apiVersion": "gpupool.io/v1alpha1", "kind": "QuotaLedger",
                                   "metadata": {"name": "tenant.t"},
                                   "spec": {"scope": "tenant t", "entries": {
                                       uid: in_flight_entry(uid, nodes[0], "t", "other")}}})
        first = schedule(r.extender, mine, nodes)[1]  # the other bind holds the quota
        fake.patch("quotaledgers", "tenant.t", {"spec": {"entries": {uid: None}}})  # rolled back
        second = schedule(r.extender, mine, nodes)[1]
    finally:
        r.close()
    assert "quota of tenant t exceeded" in first
    assert second == ""
