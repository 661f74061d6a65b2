"""The fair share of each member of a cohort that shares fairly, in TenantQuota status and
the controller's metrics — against the FAKE API server, pending pods counted as waiting."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract import names
from gpupool.controller.loop import Controller
from gpupool.controller.metrics import ControllerMetrics
from gpupool.kube.controller_ops import ControllerApi
from tests.controller.builders import GIB, device, placed_pod, sign, slices, verify


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        for i in range(4):
            server.seed("gpudevices", device("n1", i))
        yield server


@pytest.fixture
def api(fake: FakeApiServer) -> Iterator[ControllerApi]:
    client = ControllerApi.open(server=fake.url)
    yield client
    client.close()


def quota(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "generation": 1}, "spec": spec}


def pending_pod(name: str, ns: str, gpus: int = 1, gated: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox", "resources": {
        "limits": {names.RESOURCE_GPU: str(gpus)}}}]}
    if gated:
        spec["schedulingGates"] = [{"name": "example.com/wait"}]
    status: dict[str, Any] = {"phase": "Pending"}
    if gated:
        status["conditions"] = [{"type": "PodScheduled", "status": "False",
                                 "reason": "SchedulingGated"}]
    return {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}"},
            "spec": spec, "status": status}


def status_of(fake: FakeApiServer, name: str) -> dict[str, Any]:
    found = fake.get("tenantquotas", name)
    assert found is not None
    result: dict[str, Any] = found.get("status") or {}
    return result


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def seed_lab(fake: FakeApiServer, fair: bool = True) -> None:
    """team-a lends 4 idle GPUs; team-b (weight 1) holds 2 and waits for 2 more; team-c
    (weight 3) holds 1 and waits for 3 more (one more waits behind a scheduling gate)."""
    flag = {"fairSharing": True} if fair else {}
    fake.seed("tenantquotas", quota("team-a", namespaces=["a"], limits={"gpus": 4},
                                    cohort="lab", **flag))
    fake.seed("tenantquotas", quota("team-b", namespaces=["b"], limits={"gpus": 0},
                                    cohort="lab"))
    fake.seed("tenantquotas", quota("team-c", namespaces=["c"], limits={"gpus": 0},
                                    cohort="lab", weight=3))
    fake.seed("pods", sign(placed_pod("b1", "b", "n1", slices("n1", (0, 8 * GIB, 50)))))
    fake.seed("pods", sign(placed_pod("b2", "b", "n1", slices("n1", (1, 8 * GIB, 50)))))
    fake.seed("pods", sign(placed_pod("c1", "c", "n1", slices("n1", (2, 8 * GIB, 50)))))
    for name, ns in (("b3", "b"), ("b4", "b"), ("c2", "c"), ("c3", "c"), ("c4", "c")):
        fake.seed("pods", pending_pod(name, ns))
    fake.seed("pods", pending_pod("c5", "c", gated=True))


def test_each_member_sees_its_weighted_fair_share_and_whether_it_borrows_beyond_it(
        fake: FakeApiServer, api: ControllerApi) -> None:
    seed_lab(fake)
    out = Controller(api, verify=verify).reconcile_once()
    assert out.failures == []
    b, c, a = (status_of(fake, f"team-{t}")["fairShare"] for t in "bca")
    assert b == {"weight": 1, "wanted": {"gpus": 4}, "share": {"gpus": 1},
                 "entitled": {"gpus": 1}, "usedPercent": {"gpus": 200},
                 "dominantResource": "gpus", "dominantPercent": 200}
    assert (c["share"], c["entitled"], c["usedPercent"]) == \
        ({"gpus": 3}, {"gpus": 3}, {"gpus": 34})  # the gated pod does not wait here
    assert (a["share"], a["entitled"], a["usedPercent"]) == \
        ({"gpus": 0}, {"gpus": 4}, {"gpus": 0})
    beyond = condition(status_of(fake, "team-b"), "WithinFairShare")
    assert (beyond["status"], beyond["reason"]) == ("False", "BeyondFairShare")
    assert "borrows 2 GPUs of cohort lab, its fair share is 1 (weight 1)" in beyond["message"]
    assert condition(status_of(fake, "team-c"), "WithinFairShare")["status"] == "True"
    again = Controller(api, verify=verify).reconcile_once()
    assert not [s for s in again.statuses if s.startswith("TenantQuota")]  # unchanged


def test_the_fair_shares_are_exported_as_controller_metrics(
        fake: FakeApiServer, api: ControllerApi) -> None:
    seed_lab(fake)
    out = Controller(api, verify=verify).reconcile_once()
    metrics = ControllerMetrics()
    metrics.set_fair_shares(out.fair_shares)
    value = metrics.registry.get_sample_value
    assert value("gpupool_controller_tenant_fair_share", {
        "tenant": "team-c", "cohort": "lab", "resource": "gpus", "kind": "share"}) == 3
    assert value("gpupool_controller_tenant_fair_share", {
        "tenant": "team-a", "cohort": "lab", "resource": "gpus", "kind": "entitled"}) == 4
    assert value("gpupool_controller_tenant_fair_share_ratio", {
        "tenant": "team-b", "cohort": "lab", "resource": "gpus"}) == 2.0
    assert value("gpupool_controller_tenant_fair_share_dominant_ratio", {
        "tenant": "team-b", "cohort": "lab"}) == 2.0
    assert value("gpupool_controller_tenant_fair_share", {  # memory is not limited
        "tenant": "team-c", "cohort": "lab", "resource": "memory_mib", "kind": "share"}) is None
    metrics.clear_world()  # a replica that stops leading drops them
    assert value("gpupool_controller_tenant_fair_share_dominant_ratio", {
        "tenant": "team-b", "cohort": "lab"}) is None


def test_a_cohort_that_stops_sharing_fairly_loses_the_fair_share_from_status(
        fake: FakeApiServer, api: ControllerApi) -> None:
    seed_lab(fake)
    Controller(api, verify=verify).reconcile_once()
    assert "fairShare" in status_of(fake, "team-b")
    found = fake.get("tenantquotas", "team-a")
    assert found is not None
    found["spec"]["fairSharing"] = False
    fake.seed("tenantquotas", found)
    out = Controller(api, verify=verify).reconcile_once()
    assert out.fair_shares == ()
    b = status_of(fake, "team-b")
    assert "fairShare" not in b
    assert {c["type"] for c in b["conditions"]} == {"Valid", "WithinQuota"}


def test_a_cohort_without_fair_sharing_has_no_fair_share_in_status(
        fake: FakeApiServer, api: ControllerApi) -> None:
    seed_lab(fake, fair=False)
    out = Controller(api, verify=verify).reconcile_once()
    assert out.fair_shares == () and "fairShare" not in status_of(fake, "team-b")


def test_a_lenders_waiting_pod_within_its_nominal_lowers_what_the_others_share(
        fake: FakeApiServer, api: ControllerApi) -> None:
    seed_lab(fake)
    fake.seed("pods", pending_pod("a1", "a"))  # team-a takes 1 of its idle 4 back soon
    Controller(api, verify=verify).reconcile_once()
    b, c = (status_of(fake, f"team-{t}")["fairShare"] for t in "bc")
    assert (b["share"], c["share"]) == ({"gpus": 1}, {"gpus": 2})  # 3 lent, not 4
    assert status_of(fake, "team-a")["fairShare"]["wanted"] == {"gpus": 0}
