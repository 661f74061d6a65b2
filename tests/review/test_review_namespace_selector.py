"""Review: a namespace label the tenant writes moves its pods into another tenant's quota.

A TenantQuota's ``namespaceSelector`` is resolved by the controller from namespace labels
(``status.selectedNamespaces``), and the extender counts every selected namespace as the
quota's tenant. Under the threat model a tenant may label its own namespace. Mallory
labels hers ``team=b`` and becomes part of team-b's quota: her pods eat team-b's quota
(team-b's pods are refused), and a pod of hers of higher priority is admitted by
*preemption inside the quota* — the extender evicts team-b's pod to make room for it.
Unlabelling a namespace likewise leaves every quota that selected it by label.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.controller.quotastatus import resolved
from gpupool.core.tenants import TenantQuota
from gpupool.extender.preemption.plans import PreemptionSettings
from tests.extender.builders import Replica, pod_obj, schedule, seed_cluster
from tests.waiting import wait_for

ONE = {"gpupool.io/gpu": "1"}
TEAM_B = {"metadata": {"name": "team-b"}, "spec": {
    "namespaces": ["b"], "namespaceSelector": {"matchLabels": {"team": "b"}},
    "limits": {"gpus": 1}}}


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


def pod(fake: FakeApiServer, name: str, ns: str, priority: int) -> dict:
    obj = pod_obj(name, ONE, ns=ns)
    obj["spec"]["priority"] = priority
    return fake.seed("pods", obj)


def test_labelling_ones_own_namespace_never_evicts_another_tenants_pods(
        fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 2, 4)
    # mallory labels her namespace team=b; the controller resolves the selector as it does
    found = resolved(TEAM_B, {"b": (), "mallory": (("team", "b"),)})
    assert isinstance(found, TenantQuota)
    fake.seed("tenantquotas", {**TEAM_B, "status": {
        "selectedNamespaces": sorted(found.namespaces - {"b"})}})
    r = Replica(fake, preemption=PreemptionSettings(hold_s=60.0, retry_s=0.0))
    try:
        assert wait_for(lambda: "budgets" in r.cache.synced
                        and "team-b" in r.cache.catalogue.tenants.by_name)
        victim = pod(fake, "work", "b", 0)
        assert wait_for(lambda: victim["metadata"]["uid"] in r.cache.unbound)
        assert schedule(r.extender, victim, nodes)[1] == ""
        assert wait_for(lambda: r.cache.pods[victim["metadata"]["uid"]].decision is not None)
        evil = pod(fake, "evil", "mallory", 100)
        assert wait_for(lambda: evil["metadata"]["uid"] in r.cache.unbound)
        answer = r.extender.filter({"Pod": evil, "NodeNames": nodes})
        room = [v for v in answer["FailedNodes"].values() if "making room here" in v]
        assert not room, f"team-b's pod is preempted for mallory's: {room}"
        preemptor = r.extender.preemptor  # the plan is made on the planner thread
        assert preemptor is not None
        assert wait_for(lambda: not preemptor.planning and not preemptor.inflight)
        assert fake.get("pods", "work", "b") is not None
        assert not [p for m, p in fake.requests if m == "POST" and p.endswith("/eviction")]
    finally:
        r.close()
