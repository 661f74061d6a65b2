"""The client side of a remote GPU slice at admission: what a remote-required pod gets,
what it may not forge, and what is refused without a provider."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpupool.contract import slices
from gpupool.contract.podspec_request import pod_request
from gpupool.webhook.admission import Settings, mutate, validate
from gpupool.webhook.decisions import CONTROLLER_KEYS, NODE_AGENT_KEYS, Writers
from gpupool.webhook.remote import RemoteSettings
from gpupool.webhook.review import Verdict, read_review

from .builders import EXTENDER, NODE_AGENT, Obj, body, container, pod, review

CONTROLLER = "system:serviceaccount:gpupool-system:gpupool-controller"


def settings(provider: str = "stub", preload: str = "") -> Settings:
    names = iter(["0123456789abcdef", "fedcba9876543210"])
    return Settings("gpupool-scheduler",
                    Writers({NODE_AGENT: NODE_AGENT_KEYS, CONTROLLER: CONTROLLER_KEYS},
                            frozenset({EXTENDER})),
                    remote=RemoteSettings(provider, "gpupool-system", "reg.example/gpupool:1",
                                          preload, lambda: next(names)))


def remote_pod(limits: dict[str, str] | None = None, **kw: Any) -> Obj:
    notes = {"gpupool.io/placement": "remote-required", **kw.pop("annotations", {})}
    return pod("train", "lab", container(limits=limits or {"gpupool.io/gpu-memory": "4096",
                                                           "gpupool.io/gpu-core": "30"}),
               annotations=notes, **kw)


def applied(obj: Obj, verdict: Verdict) -> Obj:
    """``obj`` with the verdict's JSON patch applied (RFC 6902 add and remove, list indices
    and ``-`` included), as the API server applies it."""
    out: Obj = json.loads(json.dumps(obj))
    for op in verdict.patch:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target: Any = out
        for p in parts[:-1]:
            target = target[int(p)] if isinstance(target, list) else target[p]
        last = parts[-1]
        if op["op"] == "remove":
            del target[int(last) if isinstance(target, list) else last]
        elif isinstance(target, list):
            target.insert(len(target) if last == "-" else int(last), op["value"])
        else:
            assert op["op"] in ("add", "replace")
            target[last] = op["value"]
    return out


def admitted(obj: Obj, s: Settings | None = None) -> tuple[Obj, Verdict]:
    """The pod as mutated, and the validating webhook's verdict on it."""
    s = s or settings()
    mutated = mutate(read_review(body(review(obj))), s)
    assert mutated.allowed, mutated.message
    out = applied(obj, mutated)
    return out, validate(read_review(body(review(out))), s)


def test_a_remote_required_pod_gets_the_remote_count_sidecar_and_provider_settings() -> None:
    out, verdict = admitted(remote_pod({"gpupool.io/gpu": "1", "gpupool.io/gpu-memory": "4096"}))
    assert verdict.allowed, verdict.message
    main = out["spec"]["containers"][0]
    assert main["resources"]["limits"] == {"gpupool.io/gpu-memory": "4096",
                                           "gpupool.io/remote-gpu": "1"}
    assert main["resources"]["requests"] == {"gpupool.io/remote-gpu": "1"}
    assert {e["name"]: e["value"] for e in main["env"]} == {
        "NVIDIA_VISIBLE_DEVICES": "void", "GPUPOOL_SLICE_PROVIDER": "stub",
        "GPUPOOL_SLICE_ADDRESS": "127.0.0.1:14833"}
    assert out["metadata"]["annotations"]["gpupool.io/slice"] == "0123456789abcdef"
    side = out["spec"]["initContainers"][0]
    assert (side["name"], side["restartPolicy"], side["image"]) == (
        "gpupool-slice-client", "Always", "reg.example/gpupool:1")
    assert "--slice-server=gpupool-slice-0123456789abcdef.gpupool-system.svc:14900" in \
        side["args"]
    assert "--pod-uid=$(GPUPOOL_POD_UID)" in side["args"]
    assert side["startupProbe"]["httpGet"] == {"path": "/ready", "port": 14834}
    assert out["spec"]["volumes"] == [{"name": "gpupool-slice-credentials",
                                       "secret": {"secretName": "gpupool-slice-0123456789abcdef"}}]
    assert out["spec"]["schedulerName"] == "gpupool-scheduler"
    # the extender reads the admitted pod: one remote GPU, no device count
    assert pod_request(out).gpus[0].count == 1


def test_the_sidecar_goes_first_among_existing_init_containers_and_volumes_are_kept() -> None:
    obj = remote_pod(init=[container("setup")])
    obj["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    out, verdict = admitted(obj)
    assert verdict.allowed, verdict.message
    assert [c["name"] for c in out["spec"]["initContainers"]] == ["gpupool-slice-client",
                                                                  "setup"]
    assert [v["name"] for v in out["spec"]["volumes"]] == ["data", "gpupool-slice-credentials"]


def test_lupine_gets_its_client_settings_on_loopback() -> None:
    out, verdict = admitted(remote_pod(), settings("lupine", "/opt/lupine/libscuda.so"))
    assert verdict.allowed, verdict.message
    env = {e["name"]: e["value"] for e in out["spec"]["containers"][0]["env"]}
    assert (env["SCUDA_SERVER"], env["SCUDA_PORT"], env["LD_PRELOAD"]) == (
        "127.0.0.1", "14833", "/opt/lupine/libscuda.so")


def test_without_a_provider_a_remote_required_pod_is_refused_with_the_reason() -> None:
    verdict = mutate(read_review(body(review(remote_pod()))), settings("none"))
    assert not verdict.allowed
    assert verdict.message == ("pod lab/train: gpupool.io/placement=remote-required: remote "
                               "GPU slices are not enabled on this cluster (no data-plane "
                               "provider)")


@pytest.mark.parametrize(("edit", "named"), [
    (lambda o: o["spec"].setdefault("initContainers", []).append(
        container("gpupool-slice-client")), "init container gpupool-slice-client is named"),
    (lambda o: o["spec"]["containers"].append(container("gpupool-slice-client")),
     "container gpupool-slice-client is named"),
    (lambda o: o["spec"].setdefault("volumes", []).append(
        {"name": "gpupool-slice-credentials", "secret": {"secretName": "other"}}),
     "volume gpupool-slice-credentials"),
    (lambda o: o["spec"]["containers"][0].setdefault("env", []).append(
        {"name": "SCUDA_SERVER", "value": "10.0.0.9"}), "container main sets SCUDA_SERVER"),
])
def test_a_pod_that_already_carries_the_injection_is_refused(edit: Any, named: str) -> None:
    obj = remote_pod()
    edit(obj)
    verdict = mutate(read_review(body(review(obj))), settings())
    assert not verdict.allowed
    assert named in verdict.message
    assert "only gpupool's admission webhook writes these" in verdict.message


def test_a_slice_name_the_tenant_wrote_is_replaced() -> None:
    out, verdict = admitted(remote_pod(annotations={"gpupool.io/slice": "aaaaaaaaaaaaaaaa"}))
    assert verdict.allowed
    assert out["metadata"]["annotations"]["gpupool.io/slice"] == "0123456789abcdef"


@pytest.mark.parametrize(("edit", "why", "placement"), [
    (lambda o: o["spec"]["initContainers"][0].update(command=["sh", "-c", "sleep inf"]),
     "init container gpupool-slice-client is not the one gpupool writes", "required"),
    (lambda o: o["spec"]["initContainers"][0].update(envFrom=[{"secretRef": {"name": "x"}}]),
     "(it sets envFrom)", "required"),
    (lambda o: o["spec"]["volumes"][0]["secret"].update(secretName="gpupool-slice-other"),
     "volume gpupool-slice-credentials is not the slice's credentials", "required"),
    (lambda o: o["metadata"]["annotations"].update({"gpupool.io/slice": "../x"}),
     "is not a slice name", "required"),
    (lambda o: o["spec"]["containers"][0]["env"][2].update(value="10.9.9.9:1"),
     "container main: its provider settings are not the ones gpupool writes", "required"),
    (lambda o: o["spec"]["containers"][0].setdefault("env", []).append(
        {"name": "SCUDA_SERVER", "value": "10.9.9.9"}),
     "container main: its provider settings are not the ones gpupool writes", "allowed"),
    (lambda o: o["spec"]["volumes"][0]["secret"].pop("optional"),
     "volume gpupool-slice-credentials is not the slice's credentials", "allowed"),
    (lambda o: o["spec"]["initContainers"][0]["args"].pop(),
     "init container gpupool-slice-client is not the one gpupool writes", "allowed"),
])
def test_validation_refuses_an_injection_that_was_altered(edit: Any, why: str,
                                                          placement: str) -> None:
    out, _ = admitted(allowed_pod() if placement == "allowed" else remote_pod())
    edit(out)
    verdict = validate(read_review(body(review(out))), settings())
    assert not verdict.allowed
    assert why in verdict.message


def test_the_injection_on_a_pod_that_is_not_remote_is_refused() -> None:
    out, _ = admitted(remote_pod())
    del out["metadata"]["annotations"]["gpupool.io/placement"]
    verdict = validate(read_review(body(review(out))), settings())
    assert not verdict.allowed
    assert "asks gpupool.io/remote-gpu, which only a pod annotated" in verdict.message


def test_a_tenant_set_guarded_variable_is_still_refused_beside_the_injection() -> None:
    obj = remote_pod()
    obj["spec"]["containers"][0]["env"] = [{"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                                            "value": "100"}]
    _, verdict = admitted(obj)
    assert not verdict.allowed
    assert "sets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in verdict.message


def allowed_pod(**kw: Any) -> Obj:
    return remote_pod(annotations={"gpupool.io/placement": "remote-allowed"}, **kw)


def test_a_remote_allowed_pod_keeps_its_device_count_and_gets_an_idle_capable_sidecar() -> None:
    out, verdict = admitted(allowed_pod())
    assert verdict.allowed, verdict.message
    main = out["spec"]["containers"][0]
    assert main["resources"]["limits"]["gpupool.io/gpu"] == "1"  # its node's devices
    assert "gpupool.io/remote-gpu" not in main["resources"]["limits"]
    assert "env" not in main  # the node agent's Allocate says local or remote
    assert out["metadata"]["annotations"]["gpupool.io/slice"] == "0123456789abcdef"
    side = out["spec"]["initContainers"][0]
    assert side["args"][-1] == "--decision=$(GPUPOOL_DECISION)"
    assert side["env"][1] == {"name": "GPUPOOL_DECISION", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.annotations['gpupool.io/allocation']"}}}
    assert out["spec"]["volumes"] == [{"name": "gpupool-slice-credentials", "secret": {
        "secretName": "gpupool-slice-0123456789abcdef", "optional": True}}]
    assert pod_request(out).gpus[0].count == 1


def test_without_a_provider_a_remote_allowed_pod_is_served_locally_with_a_warning() -> None:
    obj = allowed_pod()
    out, verdict = admitted(obj, settings("none"))
    assert verdict.allowed, verdict.message
    assert "initContainers" not in out["spec"] and "gpupool.io/slice" not in \
        out["metadata"]["annotations"]
    warned = mutate(read_review(body(review(obj))), settings("none")).warnings
    assert warned == ("gpupool.io/placement=remote-allowed: remote GPU slices are not enabled "
                      "on this cluster (no data-plane provider), so the pod's GPUs are served "
                      "by its own node's devices (docs/remote.md)",)


def test_a_remote_allowed_pod_on_the_hosts_network_is_refused_where_slices_are_on() -> None:
    obj = allowed_pod()
    obj["spec"]["hostNetwork"] = True
    verdict = mutate(read_review(body(review(obj))), settings())
    assert not verdict.allowed
    assert "a remote-allowed pod may not use the host's network" in verdict.message
    assert mutate(read_review(body(review(obj))), settings("none")).allowed


def test_the_placement_annotation_is_a_users_own_but_the_slice_name_is_not_editable() -> None:
    out, _ = admitted(remote_pod())
    bound = json.loads(json.dumps(out))
    edited = json.loads(json.dumps(out))
    edited["metadata"]["annotations"]["gpupool.io/slice"] = "fedcba9876543210"
    refused = validate(read_review(body(review(edited, operation="UPDATE", old=bound))),
                       settings())
    assert not refused.allowed and "gpupool.io/slice" in refused.message
    status = json.loads(json.dumps(out))
    status["metadata"]["annotations"]["gpupool.io/slice-status"] = '{"state":"serving"}'
    by = {"tenant": "alice", "controller": CONTROLLER}
    verdicts = {who: validate(read_review(body(review(status, operation="UPDATE", old=bound,
                                                      user=user))), settings())
                for who, user in by.items()}
    assert (verdicts["tenant"].allowed, verdicts["controller"].allowed) == (False, True)


def test_the_slice_names_agree_with_the_contract() -> None:
    assert slices.server_address("0123456789abcdef", "gpupool-system") == \
        "gpupool-slice-0123456789abcdef.gpupool-system.svc:14900"


def test_the_extender_may_rewrite_a_decision_only_where_remote_slices_are_on() -> None:
    from gpupool.cli.main import build_parser
    from gpupool.cli.webhook import settings_of
    from gpupool.webhook.decisions import REPLACING_KEYS

    on = build_parser().parse_args(["webhook", "--remote-provider", "stub",
                                    "--slice-client-image", "reg.example/gpupool:1"])
    off = build_parser().parse_args(["webhook"])
    assert settings_of(on).writers.may_change(EXTENDER) == REPLACING_KEYS
    assert settings_of(off).writers.may_change(EXTENDER) == frozenset()
    with pytest.raises(SystemExit, match="needs --slice-client-image"):
        settings_of(build_parser().parse_args(["webhook", "--remote-provider", "stub"]))


def test_a_remote_pod_on_the_hosts_network_is_refused() -> None:
    """Its sidecar's data plane (unauthenticated, on loopback) would be the node's: any
    process on the host network there could use the slice, or bind the port first."""
    obj = remote_pod()
    obj["spec"]["hostNetwork"] = True
    verdict = mutate(read_review(body(review(obj))), settings())
    assert not verdict.allowed and verdict.code == 422
    assert "pod lab/train: a remote-required pod may not use the host's network" in \
        verdict.message
    out, _ = admitted(remote_pod())
    out["spec"]["hostNetwork"] = True
    verdict = validate(read_review(body(review(out))), settings())
    assert not verdict.allowed and "may not use the host's network" in verdict.message
