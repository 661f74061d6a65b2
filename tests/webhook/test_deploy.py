"""The shipped webhook manifests: every request the webhook would refuse or patch is sent
to it (its matchConditions, evaluated as CEL), requests that cannot concern gpupool are
not, and the configurations say what docs/webhook.md promises."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool.webhook.admission import mutate, validate
from gpupool.webhook.review import read_review
from gpupool.webhook.scheduling import GPUPOOL_PREFIXES

from .builders import EXTENDER, NODE_AGENT, Obj, body, container, gpu_pod, pod, review
from .cel import conditions
from .conftest import SETTINGS, shipped_configurations

DEPLOY = Path(__file__).parents[2] / "deploy" / "webhook"
CONFIGS = {d["kind"]: d for d in shipped_configurations()}
MUTATING = CONFIGS["MutatingWebhookConfiguration"]["webhooks"][0]
HOOKS = {h["name"]: h for h in CONFIGS["ValidatingWebhookConfiguration"]["webhooks"]}
DECISION = {"gpupool.io/allocation": '{"v":1}', "gpupool.io/node": "n1",
            "gpupool.io/phase": "allocating"}


def binding(notes: dict[str, str] | None) -> Obj:
    meta: Obj = {"name": "p", "namespace": "team-a"}
    if notes:
        meta["annotations"] = notes
    return {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
            "target": {"kind": "Node", "name": "n1"}}


def ephemeral_update() -> Obj:
    old = gpu_pod(node="n1")
    new = gpu_pod(node="n1", ephemeral=[container("dbg", env={"NVIDIA_VISIBLE_DEVICES": "all"})])
    return review(new, operation="UPDATE", old=old, sub="ephemeralcontainers")


def status_update(old_notes: dict[str, str], new_notes: dict[str, str], user: str) -> Obj:
    return review(gpu_pod(node="n1", annotations=new_notes), operation="UPDATE", sub="status",
                  old=gpu_pod(node="n1", annotations=old_notes), user=user)


REFUSED_OR_PATCHED: list[tuple[str, Obj]] = [
    ("pods.validate.gpupool.io", review(gpu_pod(annotations=DECISION, node="n1"))),
    ("pods.validate.gpupool.io", review(pod("p", "team-a", container(
        env={"NVIDIA_VISIBLE_DEVICES": "all"})))),
    ("pods.validate.gpupool.io", review(pod("p", "team-a", container(
        limits={"gpupool.io/gpu": "1"}, env={"LD_PRELOAD": "/x.so"})))),
    ("pods.validate.gpupool.io", review(pod("p", "team-a", container(
        requests={"class.gpupool.io/a100": "1"}, env_from=[{"secretRef": {"name": "s"}}])))),
    ("pods.validate.gpupool.io", review(pod("p", "team-a", container(), init=[container(
        "i", limits={"gpupool.io/gpu": "1"}, env={"CUDA_MPS_PIPE_DIRECTORY": "/x"})]))),
    ("pods.validate.gpupool.io", status_update(DECISION, {**DECISION, "gpupool.io/node": "n9"},
                                               "alice")),
    ("pods.validate.gpupool.io", status_update(DECISION, {"gpupool.io/mode": "shared"},
                                               "alice")),
    ("pods.validate.gpupool.io", review(gpu_pod(node="n1", annotations=DECISION),
                                        operation="UPDATE", old=gpu_pod(node="n1"))),
    ("pods.validate.gpupool.io", ephemeral_update()),
    ("pods.validate.gpupool.io", review(pod("p", "team-a", container(
        limits={"mig.gpupool.io/1g.10gb": "1"}, env={"LD_PRELOAD": "/x.so"})))),
    ("pods.validate.gpupool.io", review(pod("p", "team-a", container(), init=[container(
        "i", requests={"mig.gpupool.io/1g.10gb": "1"}, env={"CUDA_MPS_PIPE_DIRECTORY": "/x"})]))),
    ("bindings.validate.gpupool.io", review(binding(DECISION), sub="binding", kind="Binding")),
    ("tenancy.validate.gpupool.io", review({"metadata": {"name": "g"}, "spec": {
        "tenants": ["A B"]}}, resource="resourcegroups", group="gpupool.io")),
]


@pytest.mark.parametrize(("hook", "request_review"), REFUSED_OR_PATCHED)
def test_every_request_the_webhook_refuses_is_sent_to_it(hook: str, request_review: Obj
                                                         ) -> None:
    assert not validate(read_review(body(request_review)), SETTINGS).allowed
    assert conditions(HOOKS[hook], request_review["request"]) is True


def test_every_gpu_pod_is_sent_to_the_mutating_webhook_and_others_are_not() -> None:
    for obj in (gpu_pod(), pod("p", "team-a", container(limits={"class.gpupool.io/t4": "1"})),
                pod("p", "team-a", container(limits={"mig.gpupool.io/1g.10gb": "1"})),
                pod("p", "team-a", container(), init=[container(
                    "i", requests={"gpupool.io/gpu": "1"})])):
        request_review = review(obj)
        assert mutate(read_review(body(request_review)), SETTINGS).patch
        assert conditions(MUTATING, request_review["request"]) is True
    for obj in (pod(), pod("p", "team-a", container(limits={"cpu": "1", "nvidia.com/gpu": "1"}))):
        assert conditions(MUTATING, review(obj)["request"]) is False


@pytest.mark.parametrize("prefix", GPUPOOL_PREFIXES)
def test_a_pod_asking_any_gpupool_resource_is_sent_to_both_pod_webhooks(prefix: str) -> None:
    for asked in (container(limits={f"{prefix}x": "1"}), container(requests={f"{prefix}x": "1"})):
        request = review(pod("p", "team-a", asked))["request"]
        assert conditions(MUTATING, request) is True
        assert conditions(HOOKS["pods.validate.gpupool.io"], request) is True


@pytest.mark.parametrize("request_review", [
    review(pod()),
    review(pod("p", "team-a", container(env={"CUDA_VISIBLE_DEVICES": "0"}),
               annotations={"example.com/x": "y"})),
    status_update(DECISION, DECISION, "system:node:n1"),  # kubelet's status updates
    review(gpu_pod(node="n1", annotations={**DECISION, "team": "b"}), operation="UPDATE",
           old=gpu_pod(node="n1", annotations=DECISION)),
    review(pod(annotations={"example.com/x": "1"}), operation="UPDATE", old=pod()),
])
def test_requests_that_cannot_concern_gpupool_are_not_sent(request_review: Obj) -> None:
    assert conditions(HOOKS["pods.validate.gpupool.io"], request_review["request"]) is False
    assert validate(read_review(body(request_review)), SETTINGS).allowed


def test_the_node_agents_and_extenders_own_writes_are_sent_and_allowed() -> None:
    served = status_update(DECISION, {**DECISION, "gpupool.io/phase": "allocated"}, NODE_AGENT)
    assert conditions(HOOKS["pods.validate.gpupool.io"], served["request"]) is True
    assert validate(read_review(body(served)), SETTINGS).allowed
    bound = review(binding(DECISION), sub="binding", kind="Binding", user=EXTENDER)
    assert conditions(HOOKS["bindings.validate.gpupool.io"], bound["request"]) is True
    assert validate(read_review(body(bound)), SETTINGS).allowed
    plain = review(binding(None), sub="binding", kind="Binding", user="system:kube-scheduler")
    assert conditions(HOOKS["bindings.validate.gpupool.io"], plain["request"]) is False


def test_only_node_agents_evictions_are_sent() -> None:
    hook = HOOKS["evictions.validate.gpupool.io"]
    obj = {"apiVersion": "policy/v1", "kind": "Eviction",
           "metadata": {"name": "p", "namespace": "team-a"}}
    assert conditions(hook, review(obj, sub="eviction", user=NODE_AGENT)["request"]) is True
    assert conditions(hook, review(obj, sub="eviction", user="alice")["request"]) is False
    assert hook["rules"][0]["resources"] == ["pods/eviction"]


def test_every_webhook_is_v1_fails_closed_skips_the_system_namespaces_and_calls_the_service(
        ) -> None:
    for hook in [MUTATING, *HOOKS.values()]:
        assert hook["admissionReviewVersions"] == ["v1"] and hook["sideEffects"] == "None"
        assert hook["failurePolicy"] == "Fail" and hook["timeoutSeconds"] <= 10
        service = hook["clientConfig"]["service"]
        assert (service["name"], service["namespace"]) == ("gpupool-webhook", "gpupool-system")
        assert service["path"] == ("/mutate" if hook is MUTATING else "/validate")
        if any(r["scope"] == "Namespaced" for r in hook["rules"]):
            excluded = hook["namespaceSelector"]["matchExpressions"][0]
            assert excluded["key"] == "kubernetes.io/metadata.name"
            assert excluded["operator"] == "NotIn"
            assert set(excluded["values"]) == {"kube-system", "gpupool-system"}
    pods_rule = HOOKS["pods.validate.gpupool.io"]["rules"][0]
    assert set(pods_rule["resources"]) == {"pods", "pods/status", "pods/ephemeralcontainers"}


def test_the_deployment_runs_two_replicas_behind_a_pdb_and_probes_over_https() -> None:
    docs: list[dict[str, Any]] = list(yaml.safe_load_all((DEPLOY / "deployment.yaml").read_text()))
    kinds = {d["kind"]: d for d in docs}
    deployment = kinds["Deployment"]
    assert deployment["spec"]["replicas"] == 2
    assert kinds["PodDisruptionBudget"]["spec"]["minAvailable"] == 1
    container_spec = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container_spec["command"][:2] == ["gpupool", "webhook"]
    assert container_spec["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    port = kinds["Service"]["spec"]["ports"][0]
    assert (port["port"], port["targetPort"]) == (443, "https")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "gpupool-webhook"
