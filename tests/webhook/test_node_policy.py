"""The node-scoped write policy (deploy/admission/node-agent-policy.yaml), its CEL evaluated
against admission requests: a node agent writes only its own node's GPUDevices and pods,
and on those pods only the annotations it owns."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool.webhook.decisions import NODE_AGENT_KEYS

from .builders import EXTENDER, NODE_AGENT, Obj, gpu_pod, review
from .cel import Policy

POLICY_FILE = Path(__file__).parents[2] / "deploy" / "admission" / "node-agent-policy.yaml"
DOCS = list(yaml.safe_load_all(POLICY_FILE.read_text()))
POLICY = Policy(next(d for d in DOCS if d["kind"] == "ValidatingAdmissionPolicy"))
NODE_KEY = "authentication.kubernetes.io/node-name"
DECISION = {"gpupool.io/allocation": '{"v":1,"node":"n1"}', "gpupool.io/node": "n1",
            "gpupool.io/phase": "allocating", "gpupool.io/signature": "v1.0123456789abcdef.x"}


def agent(node: str | None) -> dict[str, Any]:
    return {"user": NODE_AGENT, "extra": {NODE_KEY: [node]} if node else {}}


def pod_update(node_of_pod: str, new_notes: dict[str, str], *, caller: str | None = "n1",
               sub: str = "", old_notes: dict[str, str] | None = None) -> Obj:
    old = gpu_pod(node=node_of_pod, annotations=old_notes if old_notes is not None else DECISION)
    new = gpu_pod(node=node_of_pod, annotations=new_notes)
    return review(new, operation="UPDATE", old=old, sub=sub, **agent(caller))["request"]


def device(node: str, label: str | None = None) -> Obj:
    return {"apiVersion": "gpupool.io/v1alpha1", "kind": "GPUDevice",
            "metadata": {"name": f"gpu-{node}-0", "labels": {"gpupool.io/node": label or node}},
            "spec": {"node": node, "uuid": f"GPU-{node}-0", "index": 0, "memoryMiB": 81920}}


def device_write(operation: str, new: Obj | None, old: Obj | None, *, sub: str = "",
                 caller: str | None = "n1") -> Obj:
    return review(new, operation=operation, old=old, resource="gpudevices", sub=sub,
                  group="gpupool.io", kind="GPUDevice", namespace="", **agent(caller))["request"]


# -- pods --------------------------------------------------------------------------------------
@pytest.mark.parametrize("sub", ["", "status"])
def test_a_node_agent_advances_the_phase_and_claims_devices_of_its_own_nodes_pod(sub: str) -> None:
    served = {**DECISION, "gpupool.io/phase": "allocated",
              "gpupool.io/devices": '{"main":{"v-1":"GPU-n1-0"}}'}
    outcome = POLICY.admit(pod_update("n1", served, sub=sub))
    assert outcome.applies and outcome.allowed, outcome.message
    failed = {**DECISION, "gpupool.io/phase": "failed", "gpupool.io/reason": "not signed",
              "gpupool.io/over-use": '{"main":"memory"}'}
    assert POLICY.admit(pod_update("n1", failed)).allowed


def test_a_node_agent_writing_another_nodes_pod_decision_is_refused() -> None:
    outcome = POLICY.admit(pod_update("n2", {**DECISION, "gpupool.io/phase": "failed"}))
    assert outcome.applies and not outcome.allowed
    assert outcome.message == ("the node agent of node n1 may not write pod team-a/p, which "
                               "is bound to node n2")


def test_a_node_agent_may_not_write_an_unbound_pod() -> None:
    old, new = gpu_pod(annotations=DECISION), gpu_pod(annotations={**DECISION, "x": "y"})
    request = review(new, operation="UPDATE", old=old, **agent("n1"))["request"]
    outcome = POLICY.admit(request)
    assert not outcome.allowed and "not bound to a node" in outcome.message


@pytest.mark.parametrize("notes", [
    {**DECISION, "gpupool.io/allocation": '{"v":1,"node":"n1","exclusive":true}'},
    {k: v for k, v in DECISION.items() if k != "gpupool.io/signature"},
    {**DECISION, "gpupool.io/resource-group": "team"},
])
def test_a_node_agent_editing_adding_or_removing_the_decision_itself_is_refused(
        notes: dict[str, str]) -> None:
    outcome = POLICY.admit(pod_update("n1", notes))
    assert not outcome.allowed
    assert outcome.message.startswith("the node agent of node n1 may change only "
                                      "gpupool.io/phase")


def test_a_node_agent_may_change_a_pods_other_annotations_and_labels_are_its_own_business(
        ) -> None:
    assert POLICY.admit(pod_update("n1", {**DECISION, "example.com/note": "x"})).allowed


def test_a_token_without_a_node_name_is_refused_with_what_it_needs() -> None:
    outcome = POLICY.admit(pod_update("n1", DECISION, caller=None))
    assert not outcome.allowed and "pod-bound service-account token" in outcome.message


def test_other_accounts_and_other_resources_are_not_this_policys_business() -> None:
    request = pod_update("n2", {**DECISION, "gpupool.io/phase": "failed"})
    request["userInfo"]["username"] = EXTENDER
    assert not POLICY.admit(request).applies
    config = review({"metadata": {"name": "c", "namespace": "x"}}, operation="UPDATE",
                    old={"metadata": {"name": "c", "namespace": "x"}}, resource="configmaps",
                    **agent("n1"))["request"]
    assert not POLICY.admit(config).applies


# -- GPUDevices --------------------------------------------------------------------------------
def test_a_node_agent_creates_updates_and_deletes_its_own_nodes_gpudevices() -> None:
    own = device("n1")
    healthier = copy.deepcopy(own) | {"status": {"health": "Healthy"}}
    for request in (device_write("CREATE", own, None),
                    device_write("UPDATE", own, own),
                    device_write("UPDATE", healthier, own, sub="status"),
                    device_write("DELETE", None, own)):
        outcome = POLICY.admit(request)
        assert outcome.applies and outcome.allowed, outcome.message


@pytest.mark.parametrize(("operation", "new", "old", "sub"), [
    ("CREATE", device("n2"), None, ""),
    ("CREATE", device("n1", label="n2"), None, ""),
    ("UPDATE", device("n2"), device("n2"), "status"),
    ("UPDATE", device("n2"), device("n2"), ""),
    ("UPDATE", device("n2"), device("n1"), ""),  # moving its own GPU to another node
    ("UPDATE", device("n1"), device("n2"), ""),  # taking another node's GPU
    ("DELETE", None, device("n2"), ""),
])
def test_a_node_agent_writing_another_nodes_gpudevice_is_refused(
        operation: str, new: Obj | None, old: Obj | None, sub: str) -> None:
    outcome = POLICY.admit(device_write(operation, new, old, sub=sub))
    assert outcome.applies and not outcome.allowed
    assert outcome.message.startswith("the node agent of node n1 may write only GPUDevices "
                                      "whose spec.node and label gpupool.io/node are n1")


def test_the_policy_is_bound_to_deny_and_fails_closed() -> None:
    binding = next(d for d in DOCS if d["kind"] == "ValidatingAdmissionPolicyBinding")
    policy = next(d for d in DOCS if d["kind"] == "ValidatingAdmissionPolicy")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["apiVersion"] == "admissionregistration.k8s.io/v1"


def test_the_policy_and_the_webhook_agree_on_what_a_node_agent_owns() -> None:
    owned = next(v for v in POLICY_DOC_VARIABLES if v["name"] == "owned")["expression"]
    assert set(yaml.safe_load(owned)) == set(NODE_AGENT_KEYS)
    assert NODE_AGENT in POLICY_DOC["spec"]["matchConditions"][0]["expression"]


POLICY_DOC = next(d for d in DOCS if d["kind"] == "ValidatingAdmissionPolicy")
POLICY_DOC_VARIABLES = POLICY_DOC["spec"]["variables"]
