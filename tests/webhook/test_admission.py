"""The webhook's rules, as values: which requests are allowed, denied (and why), patched."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from gpupool.core.errors import InvalidInput
from gpupool.webhook.admission import Settings, mutate, validate
from gpupool.webhook.decisions import NODE_AGENT_KEYS, Writers
from gpupool.webhook.review import BadReview, Verdict, answer, read_review

from .builders import (
    EXTENDER,
    NODE_AGENT,
    Obj,
    body,
    container,
    gpu_pod,
    pod,
    review,
)

SETTINGS = Settings("gpupool-scheduler", Writers({NODE_AGENT: NODE_AGENT_KEYS},
                                                 frozenset({EXTENDER})))
DECISION = {"gpupool.io/allocation": '{"v":1}', "gpupool.io/node": "n1",
            "gpupool.io/bind-time": "2026-01-01T00:00:00Z", "gpupool.io/phase": "allocating",
            "gpupool.io/signature": "v1.0123456789abcdef.xyz"}


def check(review_obj: Obj, rule: Any = validate) -> Verdict:
    verdict: Verdict = rule(read_review(body(review_obj)), SETTINGS)
    return verdict


def applied(obj: Obj, verdict: Verdict) -> Obj:
    """``obj`` with the verdict's JSONPatch applied (add/replace, as the API server would)."""
    out = json.loads(json.dumps(obj))
    for op in verdict.patch:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target = out
        for p in parts[:-1]:
            target = target[int(p)] if isinstance(target, list) else target[p]
        assert op["op"] in ("add", "replace")
        target[parts[-1]] = op["value"]
    return out


# -- (a) decision annotations -----------------------------------------------------------------
@pytest.mark.parametrize("key", [*sorted(DECISION), "gpupool.io/devices", "gpupool.io/reason",
                                 "gpupool.io/resource-group"])
def test_a_pod_created_with_any_decision_annotation_is_refused_naming_it(key: str) -> None:
    verdict = check(review(gpu_pod(annotations={key: "x"})))
    assert not verdict.allowed and verdict.code == 403
    assert key in verdict.message and "pod team-a/p" in verdict.message


def test_a_forged_decision_on_a_pod_created_bound_to_a_node_is_refused() -> None:
    verdict = check(review(gpu_pod(annotations=DECISION, node="n1")))
    assert not verdict.allowed
    assert "gpupool.io/allocation" in verdict.message and "remove them" in verdict.message


def test_a_pod_may_set_mode_and_affinity() -> None:
    notes = {"gpupool.io/mode": "exclusive", "gpupool.io/affinity": "pod", "team": "x"}
    assert check(review(gpu_pod(annotations=notes))).allowed


def test_a_pod_may_opt_out_of_healing_at_creation_and_later() -> None:
    notes = {"gpupool.io/healing": "off"}
    assert check(review(gpu_pod(annotations=notes))).allowed
    old = gpu_pod(node="n1")
    assert check(review(gpu_pod(node="n1", annotations=notes), operation="UPDATE",
                        old=old)).allowed


def test_a_labelled_gangs_member_may_say_what_its_gang_asks() -> None:
    notes = {"gpupool.io/gang-min-count": "8", "gpupool.io/gang-together": "domain",
             "gpupool.io/gang-domain-label": "topology.kubernetes.io/zone"}
    assert check(review(gpu_pod(annotations=notes))).allowed


@pytest.mark.parametrize(("key", "value"), [
    ("gpupool.io/gpu-memory-limit", "81920"), ("gpupool.io/gpu-core-limit", "100"),
    ("gpupool.io/mode", "exclusive"), ("gpupool.io/affinity", "least-loaded"),
    ("gpupool.io/placement", "local"), ("gpupool.io/gang-min-count", "2")])
def test_what_bind_reads_cannot_change_once_the_pod_is_bound(key: str, value: str) -> None:
    asked = {"gpupool.io/gpu-memory-limit": "2048", "gpupool.io/placement": "remote-allowed"}
    pending = gpu_pod(annotations=asked)
    assert check(review(gpu_pod(annotations={**asked, key: value}), operation="UPDATE",
                        old=pending)).allowed
    bound = gpu_pod(node="n1", annotations={**asked, **DECISION})
    for notes in ({**asked, **DECISION, key: value},
                  {k: v for k, v in {**asked, **DECISION}.items() if k != key}):
        if notes == bound["metadata"]["annotations"]:
            continue
        verdict = check(review(gpu_pod(node="n1", annotations=notes), operation="UPDATE",
                               old=bound))
        assert not verdict.allowed and key in verdict.message
        assert "bound to node n1" in verdict.message


def test_a_user_adding_a_decision_to_a_running_pod_is_refused() -> None:
    old = gpu_pod(node="n1")
    new = gpu_pod(node="n1", annotations=DECISION)
    verdict = check(review(new, operation="UPDATE", old=old))
    assert not verdict.allowed
    assert "alice may not add, change or remove" in verdict.message


@pytest.mark.parametrize("sub", ["", "status"])
def test_a_user_editing_or_removing_one_field_of_a_decision_is_refused(sub: str) -> None:
    old = gpu_pod(node="n1", annotations=DECISION)
    edited = gpu_pod(node="n1", annotations={**DECISION, "gpupool.io/allocation": '{"v":2}'})
    removed = gpu_pod(node="n1", annotations={k: v for k, v in DECISION.items()
                                              if k != "gpupool.io/allocation"})
    for new in (edited, removed):
        verdict = check(review(new, operation="UPDATE", old=old, sub=sub))
        assert not verdict.allowed and "gpupool.io/allocation" in verdict.message


def test_an_update_that_leaves_the_decision_alone_is_allowed() -> None:
    old = gpu_pod(node="n1", annotations=DECISION)
    new = gpu_pod(node="n1", annotations={**DECISION, "team": "vision"})
    assert check(review(new, operation="UPDATE", old=old)).allowed


def test_the_node_agent_may_advance_the_phase_and_claim_devices_but_not_edit_the_decision(
        ) -> None:
    old = gpu_pod(node="n1", annotations=DECISION)
    served = gpu_pod(node="n1", annotations={**DECISION, "gpupool.io/phase": "allocated",
                                             "gpupool.io/devices": '{"main":{"v-1":"GPU-1"}}'})
    assert check(review(served, operation="UPDATE", old=old, user=NODE_AGENT)).allowed
    grown = gpu_pod(node="n1", annotations={**DECISION, "gpupool.io/allocation": '{"v":9}'})
    verdict = check(review(grown, operation="UPDATE", old=old, user=NODE_AGENT))
    assert not verdict.allowed and "gpupool-node-agent" in verdict.message


def test_only_the_extender_may_bind_with_a_decision() -> None:
    binding = {"apiVersion": "v1", "kind": "Binding",
               "metadata": {"name": "p", "namespace": "team-a", "annotations": DECISION},
               "target": {"kind": "Node", "name": "n1"}}
    by_extender = review(binding, sub="binding", user=EXTENDER, kind="Binding")
    assert check(by_extender).allowed
    verdict = check(review(binding, sub="binding", user="system:serviceaccount:x:sched",
                           kind="Binding"))
    assert not verdict.allowed and "only gpupool's extender records decisions" in verdict.message
    plain = {**binding, "metadata": {"name": "p", "namespace": "team-a"}}
    assert check(review(plain, sub="binding", user="someone", kind="Binding")).allowed


# -- (b) environment -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", [
    "NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT_0",
    "CUDA_DEVICE_SM_LIMIT", "LD_PRELOAD", "GPUPOOL_GPU_MEMORY_MIB", "GPU_CORE_UTILIZATION_POLICY",
])
def test_a_gpu_container_setting_a_visibility_or_limit_variable_is_refused(name: str) -> None:
    c = container(limits={"gpupool.io/gpu-memory": "1024"}, env={name: "all"})
    verdict = check(review(pod("p", "team-a", c)))
    assert not verdict.allowed
    assert f"container main sets {name}" in verdict.message
    assert "a GPU pod may not set what decides its GPUs and limits" in verdict.message


def test_the_reported_override_attack_is_refused() -> None:
    c = container(limits={"gpupool.io/gpu-memory": "1024", "gpupool.io/gpu-core": "5"},
                  env={"NVIDIA_VISIBLE_DEVICES": "all",
                       "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80000M"})
    verdict = check(review(pod("p", "team-a", c)))
    assert "NVIDIA_VISIBLE_DEVICES" in verdict.message
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" in verdict.message


def test_a_sidecar_init_or_ephemeral_container_of_a_gpu_pod_is_guarded_too() -> None:
    gpu = container(limits={"gpupool.io/gpu": "1"})
    side = container("side", env={"NVIDIA_VISIBLE_DEVICES": "all"})
    assert "container side" in check(review(pod("p", "team-a", gpu, side))).message
    init = container("setup", env={"LD_PRELOAD": "/x.so"})
    assert "init container setup" in check(review(pod("p", "team-a", gpu, init=[init]))).message
    old = pod("p", "team-a", gpu, node="n1")
    debug = {**container("debug", env={"CUDA_MPS_PIPE_DIRECTORY": "/nowhere"})}
    new = pod("p", "team-a", gpu, node="n1", ephemeral=[debug])
    verdict = check(review(new, operation="UPDATE", old=old, sub="ephemeralcontainers"))
    assert not verdict.allowed and "ephemeral container debug" in verdict.message


def test_cuda_visible_devices_and_driver_capabilities_stay_allowed() -> None:
    c = container(limits={"gpupool.io/gpu": "1"},
                  env={"CUDA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "compute",
                       "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert check(review(pod("p", "team-a", c))).allowed


@pytest.mark.parametrize(("prefix", "allowed"), [
    (None, False), ("", False), ("CUDA_", False), ("LD_", False), ("G", False),
    ("CUDA_MPS_X_", False), ("APP_", True), ("CFG_", True),
])
def test_env_from_on_a_gpu_container_needs_a_prefix_that_cannot_produce_a_guarded_name(
        prefix: str | None, allowed: bool) -> None:
    source: Obj = {"configMapRef": {"name": "settings"}}
    if prefix is not None:
        source["prefix"] = prefix
    c = container(limits={"gpupool.io/gpu": "1"}, env_from=[source])
    verdict = check(review(pod("p", "team-a", c)))
    assert verdict.allowed == allowed
    if not allowed:
        assert "envFrom ConfigMap settings" in verdict.message
        assert "give it a prefix such as APP_" in verdict.message


def test_a_pod_without_gpus_may_use_env_from_and_hide_gpus_but_not_expose_them() -> None:
    free = container(env_from=[{"secretRef": {"name": "s"}}], env={"LD_PRELOAD": "/x.so"})
    assert check(review(pod("p", "team-a", free))).allowed
    hidden = container(env={"NVIDIA_VISIBLE_DEVICES": "void"})
    assert check(review(pod("p", "team-a", hidden))).allowed
    exposed = container(env={"NVIDIA_VISIBLE_DEVICES": "all"})
    verdict = check(review(pod("p", "team-a", exposed)))
    assert not verdict.allowed and "without asking a GPU" in verdict.message
    only_gpu = Settings(guard_all_pods=False)
    assert validate(read_review(body(review(pod("p", "team-a", exposed)))), only_gpu).allowed


# -- (c) completion ------------------------------------------------------------------------------
def test_a_gpu_pod_naming_no_scheduler_gets_gpupools_and_the_implied_gpu() -> None:
    obj = gpu_pod()
    verdict = check(review(obj), mutate)
    assert verdict.allowed and verdict.outcome == "patched"
    done = applied(obj, verdict)
    assert done["spec"]["schedulerName"] == "gpupool-scheduler"
    res = done["spec"]["containers"][0]["resources"]
    assert res["limits"]["gpupool.io/gpu"] == "1" and res["requests"]["gpupool.io/gpu"] == "1"
    assert res["limits"]["gpupool.io/gpu-memory"] == "1024"


def test_default_scheduler_counts_as_none_and_another_scheduler_is_kept_with_a_warning(
        ) -> None:
    done = applied(gpu_pod(scheduler="default-scheduler"),
                   check(review(gpu_pod(scheduler="default-scheduler")), mutate))
    assert done["spec"]["schedulerName"] == "gpupool-scheduler"
    verdict = check(review(gpu_pod(scheduler="volcano")), mutate)
    assert all(op["path"] != "/spec/schedulerName" for op in verdict.patch)
    assert "names scheduler 'volcano'" in verdict.warnings[0]


def test_a_class_container_gets_the_class_count_and_a_named_count_is_left_alone() -> None:
    by_class = container("a", limits={"class.gpupool.io/a100": "2"},
                         requests={"class.gpupool.io/a100": "2"})
    named = container("b", limits={"gpupool.io/gpu": "1", "gpupool.io/gpu-memory": "2048"})
    bare = container("c")
    obj = pod("p", "team-a", by_class, named, bare)
    done = applied(obj, check(review(obj), mutate))
    first, second, third = done["spec"]["containers"]
    assert first["resources"]["limits"]["gpupool.io/gpu"] == "2"
    assert first["resources"]["requests"]["gpupool.io/gpu"] == "2"
    assert second["resources"] == named["resources"]
    assert "resources" not in third


def test_a_pod_without_gpupool_resources_is_not_touched() -> None:
    verdict = check(review(pod()), mutate)
    assert verdict.allowed and not verdict.patch


def test_a_gpu_ask_the_scheduler_cannot_read_is_refused_with_its_reason() -> None:
    bad = pod("p", "team-a", container(limits={"gpupool.io/gpu-core": "150"}))
    for rule in (mutate, validate):
        verdict = check(review(bad), rule)
        assert not verdict.allowed and verdict.code == 422
        assert "gpu-core=150 must be 1..100" in verdict.message


def test_a_generated_name_is_shown_with_its_prefix() -> None:
    obj = gpu_pod(annotations=DECISION)
    obj["metadata"] = {"generateName": "train-", "annotations": DECISION}
    verdict = check(review(obj, namespace="team-a"))
    assert "pod team-a/train-*" in verdict.message


# -- (d) classes and groups ----------------------------------------------------------------------
@pytest.mark.parametrize(("resource", "spec", "words"), [
    ("resourceclasses", {"selector": {"matchExpressions": [
        {"key": "gpupool.io/memory", "operator": "Gt", "values": ["forty"]}]}},
     "fix spec.selector"),
    ("resourceclasses", {"selector": {"matchExpressions": [
        {"key": "m", "operator": "Near", "values": ["x"]}]}}, "operator 'Near' is not one of"),
    ("resourcegroups", {"tenants": ["Team A"]}, "spec.tenants[0] 'Team A' is not a namespace"),
    ("resourcegroups", {"nodes": ["node one"]}, "is not a node name"),
    ("resourcegroups", {"quota": {"gpus": -1}}, "must be >= 0"),
    ("resourcegroups", {"mode": "automatic", "demand": {"gpus": "8"}},
     "spec.demand.gpus must be a whole number"),
    ("resourcegroups", {"mode": "automatic"}, "spec.demand must be an object"),
    ("tenantquotas", {"namespaces": ["a"], "limits": {"gpu": 1}},
     "TenantQuota x: spec.limits has unknown keys gpu"),
    ("gpupermissions", {"tenants": ["a"], "nodeSelector": {"matchLabels": "zone=a"}},
     "GPUPermission x: spec.nodeSelector"),
    ("tenantquotas", {"namespaceSelector": {"matchLabels": {"team": "b"}}},
     "TenantQuota x: spec.namespaceSelector uses label key(s) team, which a tenant can write"),
    ("tenantquotas", {"namespaceSelector": {"matchExpressions": [
        {"key": "tenant.gpupool.io/team", "operator": "Exists"},
        {"key": "tenant.gpupool.io.evil/team", "operator": "Exists"}]}},
     "label key(s) tenant.gpupool.io.evil/team,"),
])
def test_a_broken_class_or_group_is_refused_with_what_to_fix(resource: str, spec: Obj,
                                                             words: str) -> None:
    obj = {"apiVersion": "gpupool.io/v1alpha1", "metadata": {"name": "x"}, "spec": spec}
    verdict = check(review(obj, resource=resource, group="gpupool.io", kind="X"))
    assert not verdict.allowed and verdict.code == 422
    assert words in verdict.message


def test_a_sound_class_and_group_are_allowed() -> None:
    cls = {"metadata": {"name": "a100"}, "spec": {"selector": {"matchExpressions": [
        {"key": "gpupool.io/memory", "operator": "Gt", "values": ["40Gi"]}]}}}
    grp = {"metadata": {"name": "team"}, "spec": {"nodes": ["gpu-1.example"],
                                                  "tenants": ["team-a"], "quota": {"gpus": 4}}}
    assert check(review(cls, resource="resourceclasses", group="gpupool.io")).allowed
    assert check(review(grp, resource="resourcegroups", group="gpupool.io")).allowed
    auto = {"metadata": {"name": "auto"}, "spec": {"mode": "automatic", "demand": {
        "sharePct": 25}, "models": ["A100-SXM4-80GB"]}}
    quota = {"metadata": {"name": "team-a"}, "spec": {"namespaces": ["a"], "limits": {
        "gpus": 8}, "cohort": "lab", "borrowingLimit": {"gpus": 2}, "namespaceSelector": {
        "matchLabels": {"tenant.gpupool.io/team": "a"}, "matchExpressions": [{
            "key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["b"]}]}}}
    perm = {"metadata": {"name": "zone-a"}, "spec": {"tenants": ["a"], "nodeSelector": {
        "matchLabels": {"zone": "a"}}}}
    assert check(review(auto, resource="resourcegroups", group="gpupool.io")).allowed
    assert check(review(quota, resource="tenantquotas", group="gpupool.io")).allowed
    assert check(review(perm, resource="gpupermissions", group="gpupool.io")).allowed


# -- the wire format ---------------------------------------------------------------------------
@pytest.mark.parametrize(("raw", "words"), [
    (b"not json", "not JSON"),
    (b"[]", "the body must be a JSON object"),
    (b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}', "not an"),
    (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', "request must be"),
    (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": '
     b'{"uid": "", "resource": {"resource": "pods"}, "operation": "CREATE"}}', "request.uid"),
])
def test_a_body_that_is_no_admission_review_is_refused_naming_the_problem(
        raw: bytes, words: str) -> None:
    with pytest.raises(BadReview, match=words):
        read_review(raw)


def test_a_denial_and_a_patch_take_the_admission_review_v1_form() -> None:
    denied = answer("u1", Verdict.deny("no"))
    assert denied == {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                      "response": {"uid": "u1", "allowed": False,
                                   "status": {"code": 403, "reason": "Forbidden",
                                              "message": "no"}}}
    ops = [{"op": "add", "path": "/spec/schedulerName", "value": "s"}]
    patched = answer("u2", Verdict.allow(ops))["response"]
    assert patched["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(patched["patch"])) == ops


# -- node-scoped evictions -----------------------------------------------------------------------
def eviction(user: str = NODE_AGENT, node: str | None = "n1") -> Obj:
    obj = {"apiVersion": "policy/v1", "kind": "Eviction",
           "metadata": {"name": "p", "namespace": "team-a"}}
    extra = {"authentication.kubernetes.io/node-name": [node]} if node else {}
    return review(obj, sub="eviction", user=user, extra=extra, kind="Eviction")


def evicting(where: dict[tuple[str, str], str | None]) -> Settings:
    def pod_node(namespace: str, name: str) -> str | None:
        if (namespace, name) not in where:
            raise InvalidInput("the API server is away")
        return where[(namespace, name)]
    return Settings(writers=SETTINGS.writers, node_scoped=frozenset({NODE_AGENT}),
                    pod_node=pod_node)


def judge(review_obj: Obj, settings: Settings) -> Verdict:
    return validate(read_review(body(review_obj)), settings)


def test_a_node_agent_evicts_only_pods_on_its_own_node() -> None:
    assert judge(eviction(), evicting({("team-a", "p"): "n1"})).allowed
    verdict = judge(eviction(), evicting({("team-a", "p"): "n2"}))
    assert not verdict.allowed
    assert verdict.message == ("the node agent of node n1 may not evict pod team-a/p, which is "
                               "bound to node n2")


def test_an_eviction_is_refused_without_a_node_bound_token_or_when_the_pod_cannot_be_read(
        ) -> None:
    assert "pod-bound service-account token" in judge(
        eviction(node=None), evicting({("team-a", "p"): "n1"})).message
    assert "cannot check the pod's node" in judge(eviction(), evicting({})).message
    assert judge(eviction(), evicting({("team-a", "p"): None})).allowed  # gone: API says 404


def test_other_accounts_evictions_are_not_the_webhooks_business() -> None:
    assert judge(eviction(user="alice"), evicting({("team-a", "p"): "n2"})).allowed


# -- burst limits ---------------------------------------------------------------------------------
def test_a_burst_limit_the_scheduler_can_honour_is_allowed_and_a_wrong_one_refused() -> None:
    fine = gpu_pod(annotations={"gpupool.io/gpu-memory-limit": "8192"})
    assert check(review(fine)).allowed
    low = gpu_pod(annotations={"gpupool.io/gpu-memory-limit": "512"})
    verdict = check(review(low))
    assert not verdict.allowed and verdict.code == 422
    assert "limit 512 MiB is below its request of 1024 MiB" in verdict.message


def test_a_burst_limit_on_a_pod_that_asks_no_gpu_is_refused() -> None:
    plain = pod(annotations={"gpupool.io/gpu-core-limit": "50"})
    for rule in (mutate, validate):
        verdict = check(review(plain), rule)
        assert not verdict.allowed and "asks no gpupool GPU" in verdict.message


def test_a_mig_container_gets_the_device_count_kubelet_allocates() -> None:
    asks_mig = container("a", limits={"mig.gpupool.io/1g.10gb": "2"},
                         requests={"mig.gpupool.io/1g.10gb": "2"})
    obj = pod("p", "team-a", asks_mig)
    done = applied(obj, check(review(obj), mutate))
    (first,) = done["spec"]["containers"]
    assert first["resources"]["limits"]["gpupool.io/gpu"] == "2"
    assert first["resources"]["requests"]["gpupool.io/gpu"] == "2"
    assert done["spec"]["schedulerName"] == "gpupool-scheduler"
