"""Review: a TenantQuota is enforced per extender replica, not across replicas.

The chart runs two extender replicas behind one Service; kube-scheduler binds
asynchronously, so two binds of one tenant can be in flight on both replicas at once.
The per-node GPULedger compare-and-swap keeps a GPU from being over-committed, but
nothing serialises a *tenant's* total across nodes: each replica checks the quota
against its own cache, which lags the other's writes by the watch latency. Two pods of
a tenant whose quota is 1 GPU, bound at the same time by the two replicas on two nodes,
both bind. (Replica B's watches are stopped below only to make that lag deterministic.)
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer
from waiting import wait_for

from tests.extender.builders import Replica, pod_obj, schedule, seed_cluster


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


def test_two_replicas_binding_at_once_never_exceed_a_tenant_quota(fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 2, 2)
    fake.seed("tenantquotas", {"metadata": {"name": "t"},
                               "spec": {"namespaces": ["t"], "limits": {"gpus": 1}}})
    one = fake.seed("pods", pod_obj("one", {"gpupool.io/gpu": "1"}, ns="t"))
    two = fake.seed("pods", pod_obj("two", {"gpupool.io/gpu": "1"}, ns="t"))
    a, b = Replica(fake), Replica(fake)
    try:
        for r in (a, b):
            assert wait_for(lambda r=r: len(r.cache.catalogue.tenants) == 1
                            and {"t/one", "t/two"} <= {f"{f.namespace}/{f.name}"
                                                       for f in r.cache.pods.values()})
        b.feeds.stop(timeout_s=30.0)  # b has not yet seen what a is about to write
        first = schedule(a.extender, one, nodes[:1])
        second = schedule(b.extender, two, nodes[1:])
        assert first[1] == ""
        assert second[1] != "", "both pods bound: the tenant holds 2 GPUs on a 1-GPU quota"
    finally:
        a.close()
        b.close()
