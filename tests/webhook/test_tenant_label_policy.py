"""The tenant-label policy (deploy/admission/tenant-label-policy.yaml), its CEL evaluated
against admission requests: only the configured groups (system:masters by default) may
add, change or remove a namespace's tenant.gpupool.io/ labels, which TenantQuota
namespaceSelectors read."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from .builders import Obj, review
from .cel import Policy

POLICY_FILE = Path(__file__).parents[2] / "deploy" / "admission" / "tenant-label-policy.yaml"
DOCS = list(yaml.safe_load_all(POLICY_FILE.read_text()))
POLICY = Policy(next(d for d in DOCS if d["kind"] == "ValidatingAdmissionPolicy"))
TEAM = "tenant.gpupool.io/team"


def namespace(labels: dict[str, str] | None) -> Obj:
    meta: Obj = {"name": "mallory"}
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def write(new: dict[str, str] | None, old: dict[str, str] | None = None, *,
          groups: tuple[str, ...] = ("system:authenticated",), sub: str = "") -> Obj:
    operation = "CREATE" if old is None else "UPDATE"
    request = review(namespace(new), operation=operation, resource="namespaces", sub=sub,
                     old=None if old is None else namespace(old), namespace="",
                     kind="Namespace", user="mallory")["request"]
    request["userInfo"]["groups"] = list(groups)
    return request


@pytest.mark.parametrize(("new", "old"), [
    ({TEAM: "b"}, None),
    ({TEAM: "b", "team": "a"}, {"team": "a"}),
    ({TEAM: "b"}, {TEAM: "a"}),
    ({}, {TEAM: "a"}),
    (None, {TEAM: "a", "kubernetes.io/metadata.name": "mallory"}),
    ({TEAM: "a", "tenant.gpupool.io/zone": "z1"}, {TEAM: "a"}),
])
def test_a_tenant_may_not_add_change_or_remove_a_tenant_label_on_its_namespace(
        new: dict[str, str] | None, old: dict[str, str] | None) -> None:
    outcome = POLICY.admit(write(new, old))
    assert outcome.applies and not outcome.allowed
    assert outcome.message.startswith("namespace mallory: only members of system:masters may")
    assert "tenant.gpupool.io/" in outcome.message


def test_the_refusal_names_the_first_label_and_counts_the_rest() -> None:
    outcome = POLICY.admit(write({TEAM: "b", "tenant.gpupool.io/zone": "z"}, {}))
    assert outcome.message.endswith(" and 1 more")


@pytest.mark.parametrize(("new", "old"), [
    ({"team": "b"}, None),
    ({"team": "b", TEAM: "a"}, {TEAM: "a"}),
    (None, None),
    ({}, {"team": "a"}),
    ({"tenant.gpupool.io.example/team": "b"}, {}),
])
def test_labels_outside_the_reserved_prefix_and_unchanged_tenant_labels_are_anyones(
        new: dict[str, str] | None, old: dict[str, str] | None) -> None:
    outcome = POLICY.admit(write(new, old))
    assert outcome.allowed, outcome.message


@pytest.mark.parametrize("sub", ["", "status", "finalize"])
def test_a_member_of_a_label_writer_group_may_set_tenant_labels(sub: str) -> None:
    request = write({TEAM: "b"}, {TEAM: "a"}, groups=("system:authenticated",
                                                      "system:masters"), sub=sub)
    outcome = POLICY.admit(request)
    assert not outcome.applies and outcome.allowed
    assert not POLICY.admit(write({TEAM: "b"}, {TEAM: "a"}, sub=sub)).allowed


def test_a_request_without_groups_is_judged_like_any_other() -> None:
    request = write({TEAM: "b"}, {})
    del request["userInfo"]["groups"]
    assert not POLICY.admit(request).allowed


def test_the_policy_is_bound_to_deny() -> None:
    binding = next(d for d in DOCS if d["kind"] == "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": "gpupool-tenant-labels",
                               "validationActions": ["Deny"]}
    assert POLICY.failure_policy == "Fail"


def test_the_chart_exempts_exactly_the_groups_of_tenancy_label_writers() -> None:
    chart = pytest.importorskip("tests.test_chart")
    if chart.HELM is None:
        pytest.skip("no helm binary")
    docs = chart.render("tenancy.labelWriters={platform-admins,namespace-operator}")
    policy = Policy(chart.one(docs, "ValidatingAdmissionPolicy", "gpupool-tenant-labels"))
    change = write({TEAM: "b"}, {TEAM: "a"}, groups=("namespace-operator",))
    assert not policy.admit(change).applies
    refused = policy.admit(write({TEAM: "b"}, {TEAM: "a"}, groups=("system:masters",)))
    assert not refused.allowed
    assert "only members of platform-admins, namespace-operator may" in refused.message


@pytest.mark.parametrize("label", ["tenant.gpupool.io/placement",
                                   "tenant.gpupool.io/placement-minimum"])
def test_a_tenant_may_not_set_or_lower_its_namespaces_placement_labels(label: str) -> None:
    from gpupool.webhook.placement import LABELS

    assert label in LABELS
    for new, old in (({label: "local"}, {label: "remote-required"}), ({}, {label: "local"}),
                     ({label: "remote-allowed"}, None)):
        outcome = POLICY.admit(write(new, old))
        assert outcome.applies and not outcome.allowed, (new, old)
        assert label in outcome.message
