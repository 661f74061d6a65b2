"""The gang-label policy (deploy/admission/gang-label-policy.yaml), its CEL evaluated
against admission requests: a pod's gpupool.io/gang label is fixed when the pod is
created (added later, it would shield a pod from preemption; changed or removed, it would
move a member out of the gang it was placed with)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from .builders import Obj, review
from .cel import Policy

POLICY_FILE = Path(__file__).parents[2] / "deploy" / "admission" / "gang-label-policy.yaml"
DOCS = list(yaml.safe_load_all(POLICY_FILE.read_text()))
POLICY = Policy(next(d for d in DOCS if d["kind"] == "ValidatingAdmissionPolicy"))
GANG = "gpupool.io/gang"


def pod(labels: dict[str, str] | None) -> Obj:
    meta: Obj = {"name": "train-0", "namespace": "team-a"}
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": "gpu-1", "containers": [{"name": "main"}]}}


def update(new: dict[str, str] | None, old: dict[str, str] | None) -> Obj:
    return review(pod(new), operation="UPDATE", old=pod(old))["request"]


@pytest.mark.parametrize(("new", "old", "was"), [
    ({GANG: "shield"}, None, "it had none"),
    ({GANG: "shield", "app": "x"}, {"app": "x"}, "it had none"),
    ({GANG: "b"}, {GANG: "a"}, "it was a"),
    ({}, {GANG: "a"}, "it was a"),
    ({GANG: ""}, {GANG: "a"}, "it was a"),
    ({GANG: ""}, {}, "it had none"),
], ids=["added", "added beside others", "changed", "removed", "emptied", "added empty"])
def test_a_pods_gang_label_cannot_be_added_changed_or_removed_after_creation(
        new: dict[str, str] | None, old: dict[str, str] | None, was: str) -> None:
    outcome = POLICY.admit(update(new, old))
    assert outcome.applies and not outcome.allowed
    assert outcome.message == (f"pod team-a/train-0: the gpupool.io/gang label is fixed when "
                               f"the pod is created ({was}); make a new pod to join or leave "
                               "a gang")


@pytest.mark.parametrize(("new", "old"), [
    ({GANG: "a", "app": "y"}, {GANG: "a", "app": "x"}),
    ({"app": "y"}, {"app": "x"}),
    (None, None),
    ({GANG: "a"}, {GANG: "a"}),
], ids=["other labels of a member", "other labels of any pod", "no labels", "unchanged"])
def test_other_label_changes_and_an_unchanged_gang_label_are_anyones(
        new: dict[str, str] | None, old: dict[str, str] | None) -> None:
    outcome = POLICY.admit(update(new, old))
    assert outcome.allowed, outcome.message


def test_the_policy_is_bound_to_deny() -> None:
    binding = next(d for d in DOCS if d["kind"] == "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": "gpupool-gang-label",
                               "validationActions": ["Deny"]}
    assert POLICY.failure_policy == "Fail"


@pytest.mark.parametrize("sub", ["", "status"])
def test_the_label_is_guarded_on_the_pod_and_its_status_and_kubelets_updates_pass(
        sub: str) -> None:
    """A pods/status UPDATE carries the whole pod and the API server keeps its metadata."""
    adds = review(pod({GANG: "shield"}), operation="UPDATE", old=pod({}), sub=sub)["request"]
    outcome = POLICY.admit(adds)
    assert outcome.applies and not outcome.allowed
    kubelet = review(pod({GANG: "a"}), operation="UPDATE", old=pod({GANG: "a"}), sub=sub,
                     user="system:node:gpu-1")["request"]
    assert POLICY.admit(kubelet).allowed
    rules = DOCS[0]["spec"]["matchConstraints"]["resourceRules"]
    assert rules[0]["resources"] == ["pods", "pods/status"]
