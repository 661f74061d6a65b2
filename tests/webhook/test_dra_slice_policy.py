"""The node-scoped ResourceSlice policy (deploy/admission/node-agent-slice-policy.yaml), its
CEL evaluated against admission requests: a node agent writes only gpu.gpupool.io slices
of its own node and pool."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from .builders import EXTENDER, NODE_AGENT, Obj, review
from .cel import Policy

POLICY_FILE = Path(__file__).parents[2] / "deploy" / "admission" / "node-agent-slice-policy.yaml"
DOCS = list(yaml.safe_load_all(POLICY_FILE.read_text()))
POLICY = Policy(next(d for d in DOCS if d["kind"] == "ValidatingAdmissionPolicy"))
NODE_KEY = "authentication.kubernetes.io/node-name"


def agent(node: str | None) -> dict[str, Any]:
    return {"user": NODE_AGENT, "extra": {NODE_KEY: [node]} if node else {}}


def slice_of(node: str, pool: str | None = None, driver: str = "gpu.gpupool.io") -> Obj:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{driver}"},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": pool or node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0"}]}}


def for_all_nodes(pool: str) -> Obj:
    obj = slice_of(pool)
    del obj["spec"]["nodeName"]
    obj["spec"]["allNodes"] = True
    return obj


def write(operation: str, new: Obj | None, old: Obj | None, *, caller: str | None = "n1",
          user: str | None = None) -> Obj:
    who = agent(caller)
    if user is not None:
        who["user"] = user
    return review(new, operation=operation, old=old, resource="resourceslices",
                  group="resource.k8s.io", kind="ResourceSlice", namespace="", **who)["request"]


def test_a_node_agent_publishes_updates_and_deletes_its_own_nodes_slice() -> None:
    own = slice_of("n1")
    bumped = copy.deepcopy(own)
    bumped["spec"]["pool"]["generation"] = 2
    for request in (write("CREATE", own, None), write("UPDATE", bumped, own),
                    write("DELETE", None, bumped)):
        outcome = POLICY.admit(request)
        assert outcome.applies and outcome.allowed, outcome.message


@pytest.mark.parametrize(("new", "why"), [
    (slice_of("n2"), "another node"),
    (slice_of("n1", pool="n2"), "another node's pool"),
    (slice_of("n1", driver="gpu.nvidia.com"), "another driver"),
    (for_all_nodes("n1"), "devices for all nodes"),
])
def test_a_node_agent_may_not_publish_a_slice_beyond_its_own_node(new: Obj, why: str) -> None:
    outcome = POLICY.admit(write("CREATE", new, None))
    assert outcome.applies and not outcome.allowed, why
    assert outcome.message == (
        "the node agent of node n1 may write only ResourceSlices of driver gpu.gpupool.io "
        f"whose spec.nodeName and spec.pool.name are n1 (ResourceSlice {new['metadata']['name']})")


@pytest.mark.parametrize(("operation", "new", "old", "words"), [
    ("UPDATE", slice_of("n1"), slice_of("n2"), "which is of node n2"),  # taking over
    ("DELETE", None, slice_of("n2"), "which is of node n2"),
    ("DELETE", None, for_all_nodes("shared"), "which is not of a single node"),
])
def test_a_node_agent_may_not_change_or_delete_another_nodes_slice(
        operation: str, new: Obj | None, old: Obj, words: str) -> None:
    outcome = POLICY.admit(write(operation, new, old))
    assert outcome.applies and not outcome.allowed
    assert outcome.message.startswith("the node agent of node n1 may not change or delete "
                                      "ResourceSlice ")
    assert outcome.message.endswith(words)


def test_a_token_without_a_node_name_is_refused_with_what_it_needs() -> None:
    outcome = POLICY.admit(write("CREATE", slice_of("n1"), None, caller=None))
    assert not outcome.allowed and "pod-bound service-account token" in outcome.message


def test_other_accounts_are_not_this_policys_business() -> None:
    assert not POLICY.admit(write("CREATE", slice_of("n2"), None, user=EXTENDER)).applies


def test_the_slice_policy_is_bound_to_deny_and_fails_closed() -> None:
    binding = next(d for d in DOCS if d["kind"] == "ValidatingAdmissionPolicyBinding")
    policy = next(d for d in DOCS if d["kind"] == "ValidatingAdmissionPolicy")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert NODE_AGENT in policy["spec"]["matchConditions"][0]["expression"]
