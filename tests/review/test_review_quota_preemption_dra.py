"""Review: preemption inside a tenant's quota may make room on a DRA node.

Filter and bind keep device-plugin pods off DRA nodes (``NodeModes.constraints``), but
``tenantpreempt.plan`` works out the room with the core's ``constraints_for``, which
knows nothing of node modes. When the only sent node with room is a DRA node, the quota
plan holds room there and evicts the tenant's own pod of lower priority — for a pod that
filter and bind will then refuse on that node: a pod lost for nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract import dra
from gpupool.extender.preemption.plans import PreemptionSettings
from tests.extender.builders import Replica, gpu_obj, node_obj, pod_obj, schedule
from tests.waiting import wait_for

ONE = {"gpupool.io/gpu": "1"}
MODE = {dra.NODE_MODE_LABEL: dra.MODE_DRA}


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


def pod(fake: FakeApiServer, name: str, ns: str, priority: int) -> dict:
    obj = pod_obj(name, ONE, ns=ns)
    obj["spec"]["priority"] = priority
    return fake.seed("pods", obj)


def test_a_quota_preemption_never_makes_room_on_a_dra_node_for_a_device_plugin_pod(
        fake: FakeApiServer) -> None:
    for name in ("full", "other"):
        fake.seed("nodes", node_obj(name))
        fake.seed("gpudevices", gpu_obj(name, 0))
    fake.seed("nodes", node_obj("dra", labels={"kubernetes.io/hostname": "dra", **MODE}))
    fake.seed("gpudevices", gpu_obj("dra", 0, labels=MODE))
    fake.seed("tenantquotas", {"metadata": {"name": "t"},
                               "spec": {"namespaces": ["t"], "limits": {"gpus": 1}}})
    r = Replica(fake, preemption=PreemptionSettings(hold_s=60.0, retry_s=0.0))
    try:
        assert wait_for(lambda: "budgets" in r.cache.synced and "t" in
                        r.cache.catalogue.tenants.by_name and len(r.cache.state.nodes) == 3)
        for name, ns, node, prio in (("busy", "u", "full", 1000), ("low", "t", "other", 0)):
            p = pod(fake, name, ns, prio)
            assert wait_for(lambda p=p: p["metadata"]["uid"] in r.cache.unbound)
            assert schedule(r.extender, p, [node])[1] == ""
        urgent = pod(fake, "urgent", "t", 100)
        assert wait_for(lambda: urgent["metadata"]["uid"] in r.cache.unbound)
        answer = r.extender.filter({"Pod": urgent, "NodeNames": ["full", "dra"]})
        assert "making room here" not in answer["FailedNodes"].get("dra", ""), answer
        preemptor = r.extender.preemptor  # the plan is made on the planner thread
        assert preemptor is not None
        assert wait_for(lambda: not preemptor.planning and not preemptor.inflight)
        assert r.cache.live_hold(urgent["metadata"]["uid"]) is None or \
            r.cache.live_hold(urgent["metadata"]["uid"])[0] != "dra"
        assert fake.get("pods", "low", "t") is not None  # not evicted for nothing
        again = r.extender.filter({"Pod": urgent, "NodeNames": ["full", "dra"]})
        assert "making room here" not in again["FailedNodes"].get("dra", ""), again
    finally:
        r.close()
