"""Review of the bind's roll back: a Binding that fails because the pod is already bound
(another replica's bind of the same pod won) must not remove the winner's ledger entries."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer
from waiting import wait_for

from tests.extender.builders import Replica, pod_obj, schedule, seed_cluster

ONE_GPU = {"gpupool.io/gpu": "1"}


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


def entries(fake: FakeApiServer, plural: str) -> dict[str, set[str]]:
    return {o["metadata"]["name"]: set(o["spec"].get("entries") or {})
            for o in fake.objects(plural)}


def test_a_losing_bind_of_a_pod_already_bound_leaves_the_winners_ledger_entries(
        fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 1, 4)
    spec: dict[str, Any] = {"namespaces": ["t"], "limits": {"gpus": 2}}
    fake.seed("tenantquotas", {"metadata": {"name": "t"}, "spec": spec})
    pod = fake.seed("pods", pod_obj("p", ONE_GPU, ns="t"))
    uid = pod["metadata"]["uid"]
    a, b = Replica(fake), Replica(fake)
    try:
        for r in (a, b):
            assert wait_for(lambda r=r: len(r.cache.catalogue.tenants) == 1 and
                            uid in r.cache.unbound)
        b.feeds.stop(timeout_s=30.0)  # b still sees the pod pending (a retried bind)
        assert schedule(a.extender, pod, nodes)[1] == ""
        late = schedule(b.extender, pod, nodes)[1]
    finally:
        a.close()
        b.close()
    assert late != ""  # the API server refused the second Binding
    assert fake.get("pods", "p", "t")["spec"]["nodeName"] == nodes[0]
    assert entries(fake, "quotaledgers") == {"tenant.t": {uid}}
    assert entries(fake, "gpuledgers") == {nodes[0]: {uid}}
