"""TenantQuota status written by the controller: used, limit, remaining, borrowed, per class;
broken quotas and shared namespaces said so — against the FAKE API server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.controller.loop import Controller
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


TEAM = "tenant.gpupool.io/team"  # a label only admins may set


def quota(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "generation": 1}, "spec": spec}


def status_of(fake: FakeApiServer, name: str) -> dict[str, Any]:
    found = fake.get("tenantquotas", name)
    assert found is not None
    result: dict[str, Any] = found.get("status") or {}
    return result


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def test_status_adds_up_the_tenants_namespaces_and_counts_what_it_borrows(
        fake: FakeApiServer, api: ControllerApi) -> None:
    fake.seed("tenantquotas", quota("team-a", namespaces=["a", "a-dev"], limits={"gpus": 1},
                                    cohort="lab", classes={"big": {"gpus": 4}}))
    fake.seed("tenantquotas", quota("team-b", namespaces=["b"], limits={"gpus": 3},
                                    cohort="lab"))
    fake.seed("pods", sign(placed_pod("p", "a", "n1", slices("n1", (0, 8 * GIB, 50)))))
    later = placed_pod("q", "a-dev", "n1", slices("n1", (1, 8 * GIB, 50)), class_name="big")
    later["metadata"]["annotations"]["gpupool.io/bind-time"] = "2026-01-02T00:00:00Z"
    fake.seed("pods", sign(later))
    out = Controller(api, verify=verify).reconcile_once()
    assert out.failures == [] and "TenantQuota/team-a" in out.statuses
    a = status_of(fake, "team-a")
    assert a["used"] == {"gpus": 2, "memoryMiB": 16 * GIB, "corePct": 100}
    assert a["limit"] == {"gpus": 1} and a["remaining"] == {"gpus": 0}
    assert a["borrowed"] == {"gpus": 1, "memoryMiB": 0, "corePct": 0}
    assert a["borrowedPods"] == ["a-dev/q"]  # the younger pod beyond the nominal
    assert a["usedByClass"] == {"big": {"gpus": 1, "memoryMiB": 8 * GIB, "corePct": 50}}
    assert a["namespaces"] == ["a", "a-dev"]
    within = condition(a, "WithinQuota")
    assert (within["status"], within["reason"]) == ("False", "Borrowing")
    b = status_of(fake, "team-b")
    assert b["used"]["gpus"] == 0 and b["borrowed"]["gpus"] == 0
    assert condition(b, "WithinQuota")["status"] == "True"
    again = Controller(api, verify=verify).reconcile_once()
    assert not [s for s in again.statuses if s.startswith("TenantQuota")]  # nothing changed


def test_a_broken_quota_gets_a_false_valid_condition_naming_the_field(
        fake: FakeApiServer, api: ControllerApi) -> None:
    fake.seed("tenantquotas", quota("typo", namespaces=["a"], limits={"gpu": 2}))
    Controller(api, verify=verify).reconcile_once()
    valid = condition(status_of(fake, "typo"), "Valid")
    assert valid["status"] == "False" and valid["reason"] == "InvalidSpec"
    assert "spec.limits has unknown keys gpu" in valid["message"]
    assert valid["observedGeneration"] == 1


def test_a_namespace_two_quotas_claim_is_named_in_both(fake: FakeApiServer,
                                                       api: ControllerApi) -> None:
    fake.seed("tenantquotas", quota("x", namespaces=["shared", "x"]))
    fake.seed("tenantquotas", quota("y", namespaces=["shared"]))
    Controller(api, verify=verify).reconcile_once()
    assert condition(status_of(fake, "x"), "Valid")["message"].endswith("shared also in y")
    assert condition(status_of(fake, "y"), "Valid")["reason"] == "NamespaceShared"


def test_a_namespace_selector_is_resolved_into_status_and_follows_label_changes(
        fake: FakeApiServer, api: ControllerApi) -> None:
    for name, team in (("x1", "x"), ("x2", "x"), ("y1", "y")):
        fake.seed("namespaces", {"metadata": {"name": name, "labels": {TEAM: team}}})
    fake.seed("tenantquotas", quota("team-x", namespaces=["named"],
                                    namespaceSelector={"matchLabels": {TEAM: "x"}},
                                    limits={"gpus": 4}))
    fake.seed("pods", sign(placed_pod("p", "x2", "n1", slices("n1", (0, 8 * GIB, 50)))))
    fake.seed("pods", sign(placed_pod("q", "y1", "n1", slices("n1", (1, 8 * GIB, 50)))))
    Controller(api, verify=verify).reconcile_once()
    s = status_of(fake, "team-x")
    assert s["selectedNamespaces"] == ["x1", "x2"]
    assert s["namespaces"] == ["named", "x1", "x2"] and s["used"]["gpus"] == 1
    fake.patch("namespaces", "y1", {"metadata": {"labels": {TEAM: "x"}}})
    Controller(api, verify=verify).reconcile_once()
    s = status_of(fake, "team-x")
    assert s["selectedNamespaces"] == ["x1", "x2", "y1"] and s["used"]["gpus"] == 2


def test_a_namespace_selector_over_a_label_tenants_can_write_selects_nothing_and_says_why(
        fake: FakeApiServer, api: ControllerApi) -> None:
    fake.seed("namespaces", {"metadata": {"name": "mallory", "labels": {"team": "x"}}})
    fake.seed("tenantquotas", quota("team-x", namespaces=["x"], namespaceSelector={
        "matchLabels": {"team": "x"}, "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "Exists"}]},
        limits={"gpus": 4}))
    Controller(api, verify=verify).reconcile_once()
    s = status_of(fake, "team-x")
    assert s["selectedNamespaces"] == [] and s["namespaces"] == ["x"]
    valid = condition(s, "Valid")
    assert (valid["status"], valid["reason"]) == ("False", "UntrustedSelector")
    assert "label key(s) team," in valid["message"] and "tenant.gpupool.io/" in valid["message"]
