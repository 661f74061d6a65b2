"""The chart with remote GPU slices on: the slices' namespace, the controller's and the
webhook's flags, the NetworkPolicy of the servers, and the admission policy confining the
controller's Secret writes outside that namespace (its CEL evaluated)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gpupool.controller.sliceserver import Served, ServerSettings, server_pod
from gpupool.core.allocation import Allocation, Slice
from tests.test_chart import HELM, container, helm_error, one, render
from tests.webhook.builders import review
from tests.webhook.cel import Policy

pytestmark = pytest.mark.skipif(HELM is None, reason="no helm binary")
CONTROLLER = "system:serviceaccount:gpupool-system:gpupool-controller"


def test_off_by_default_nothing_of_remote_slices_is_rendered() -> None:
    docs = render()
    assert not [d for d in docs if d["metadata"]["name"].startswith(
        ("gpupool-slices", "gpupool-controller-slice", "gpupool-slice-servers"))]
    args = container(docs, "Deployment", "gpupool-controller")["args"]
    assert not [a for a in args if a.startswith("--remote-provider")]


def test_the_stub_provider_wires_controller_webhook_namespace_and_network_policy() -> None:
    docs = render("remote.provider=stub")
    assert one(docs, "Namespace", "gpupool-slices")
    args = container(docs, "Deployment", "gpupool-controller")["args"]
    assert {"--remote-provider=stub", "--slice-namespace=gpupool-slices",
            "--slice-server-image=gpupool:0.1.0", "--slice-lost-after=30"} <= set(args)
    agent = one(docs, "DaemonSet", "gpupool-node-agent")["spec"]["template"]["spec"]
    assert {"--slice-namespace=gpupool-slices", "--remote-provider=stub"} <= set(
        agent["containers"][0]["args"])  # remote-allowed pods served elsewhere: no device
    extender = container(docs, "Deployment", "gpupool-extender")["args"]
    assert {"--remote-slices", "--topology-label=topology.kubernetes.io/zone"} <= set(extender)
    hook = container(docs, "Deployment", "gpupool-webhook")["args"]
    assert {"--remote-provider=stub", "--slice-namespace=gpupool-slices",
            "--slice-client-image=gpupool:0.1.0"} <= set(hook)
    policy = one(docs, "NetworkPolicy", "gpupool-slice-servers")
    assert policy["metadata"]["namespace"] == "gpupool-slices"
    assert [r["ports"] for r in policy["spec"]["ingress"]] == [
        [{"protocol": "TCP", "port": 14900}], [{"protocol": "TCP", "port": 14901}]]
    mutating = one(docs, "MutatingWebhookConfiguration", "gpupool-webhook")["webhooks"][0]
    assert "gpupool-slices" in mutating["namespaceSelector"]["matchExpressions"][0]["values"]


def test_lupine_needs_its_image_and_command() -> None:
    assert "remote.provider lupine needs remote.server.image" in helm_error(
        "--set", "remote.provider=lupine")
    docs = render("remote.provider=lupine", "remote.server.image=reg.example/lupine-gp:1",
                  "remote.server.lupineCommand=/opt/lupine/server",
                  "remote.lupineClientLibrary=/opt/lupine/libscuda.so")
    args = container(docs, "Deployment", "gpupool-controller")["args"]
    assert {"--slice-server-image=reg.example/lupine-gp:1",
            "--lupine-server-command=/opt/lupine/server",
            "--lupine-server-env=SCUDA_PORT={port}"} <= set(args)
    agent = one(docs, "DaemonSet", "gpupool-node-agent")["spec"]["template"]["spec"]
    hook = container(docs, "Deployment", "gpupool-webhook")["args"]
    same = {"--remote-provider=lupine", "--lupine-client-library=/opt/lupine/libscuda.so"}
    assert same <= set(agent["containers"][0]["args"]) and same <= set(hook)


def secret(name: str, component: str = "slice-client", kind: str = "kubernetes.io/tls"
           ) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "type": kind,
            "metadata": {"name": name, "namespace": "lab",
                         "labels": {"app.kubernetes.io/component": component}}}


def write(operation: str, new: dict[str, Any] | None, old: dict[str, Any] | None = None,
          user: str = CONTROLLER, namespace: str = "lab") -> dict[str, Any]:
    return review(new, operation=operation, old=old, resource="secrets", kind="Secret",
                  user=user, namespace=namespace)["request"]


def test_the_controller_may_write_only_sidecar_secrets_outside_the_slices_namespace() -> None:
    policy = Policy(one(render("remote.provider=stub"), "ValidatingAdmissionPolicy",
                        "gpupool-controller-slice-secrets"))
    mine = secret("gpupool-slice-0123456789abcdef")
    assert policy.admit(write("CREATE", mine)).allowed
    assert policy.admit(write("UPDATE", mine, mine)).allowed
    for refused in (write("CREATE", secret("gpupool-decision-signing")),
                    write("CREATE", secret("gpupool-slice-0123456789abcdef", "other")),
                    write("CREATE", secret("gpupool-slice-0123456789abcdef", kind="Opaque")),
                    write("UPDATE", mine, secret("gpupool-slice-0123456789abcdef", "app")),
                    write("DELETE", None, mine)):
        outcome = policy.admit(refused)
        assert outcome.applies and not outcome.allowed, refused
    assert "may write only the sidecar Secrets" in policy.admit(
        write("CREATE", secret("db-password"))).message
    assert not policy.admit(write("CREATE", secret("x"), namespace="gpupool-slices")).applies
    assert not policy.admit(write("CREATE", secret("x"), user="alice")).applies


EXTENDER = "system:serviceaccount:gpupool-system:gpupool-extender"
SLICE_STATUS = {"gpupool.io/slice-status": '{"state":"serving"}'}
DECISION = {"gpupool.io/allocation": '{"v":2}', "gpupool.io/node": "n1",
            "gpupool.io/signature": "k1.sig"}


def workload(notes: dict[str, str] | None = None, image: str = "cuda:12",
             labels: dict[str, str] | None = None, ns: str = "lab") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "train", "namespace": ns,
                            "annotations": {"gpupool.io/slice": "0123456789abcdef",
                                            **(notes or {})}}
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": image}]}}


def patch(old: dict[str, Any], new: dict[str, Any], user: str) -> dict[str, Any]:
    ns = new["metadata"]["namespace"]
    return review(new, operation="UPDATE", old=old, user=user, namespace=ns)["request"]


def test_the_controller_and_extender_patch_only_their_own_annotations_of_pods() -> None:
    policy = Policy(one(render("remote.provider=stub"), "ValidatingAdmissionPolicy",
                        "gpupool-annotation-writers"))
    before = workload()
    assert policy.admit(patch(before, workload(SLICE_STATUS), CONTROLLER)).allowed
    assert policy.admit(patch(workload(DECISION), workload({**DECISION, "gpupool.io/node": "n2"}),
                              EXTENDER)).allowed
    for refused in (
            patch(before, workload(SLICE_STATUS, image="evil:1"), CONTROLLER),
            patch(before, workload(labels={"app": "x"}), CONTROLLER),
            patch(before, workload({"gpupool.io/allocation": "{}"}), CONTROLLER),
            patch(before, workload({"example.com/x": "1"}), CONTROLLER),
            patch(workload(ns="gpupool-system"), workload(image="evil:1", ns="gpupool-system"),
                  CONTROLLER),
            patch(workload(DECISION), workload(DECISION, image="evil:1"), EXTENDER),
            patch(before, workload(SLICE_STATUS), EXTENDER)):
        outcome = policy.admit(refused)
        assert outcome.applies and not outcome.allowed, refused
        assert outcome.message.startswith("system:serviceaccount:gpupool-system:gpupool-")
    assert "may not change the spec" in policy.admit(
        patch(before, workload(image="evil:1"), CONTROLLER)).message
    assert not policy.admit(patch(before, workload(image="mine:2"), "alice")).applies


def server_pod_of(isolation: str) -> dict[str, Any]:
    alloc = Allocation("u1", "cpu1", 1000, 1024, (Slice("GPU-g1-0", 0, 4096, 30, "main"),),
                       False, "g1")
    served = Served("u1", "lab", "train", "0123456789abcdef", alloc)
    return server_pod(served, 1, ServerSettings("stub", "gpupool-slices", "gpupool:0.1.0"),
                      isolation)


def made(pod: dict[str, Any], user: str = CONTROLLER) -> dict[str, Any]:
    return review(pod, user=user, namespace=pod["metadata"]["namespace"])["request"]


def altered(isolation: str, change: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    pod = server_pod_of(isolation)
    change(pod)
    return pod


def test_the_controller_makes_only_slice_server_pods() -> None:
    policy = Policy(one(render("remote.provider=stub"), "ValidatingAdmissionPolicy",
                        "gpupool-controller-slice-servers"))
    for isolation in ("mps", "hami-core", "none"):
        assert policy.admit(made(server_pod_of(isolation))).allowed, isolation
    spec = "spec"
    changes: list[Callable[[dict[str, Any]], object]] = [
        lambda p: p[spec]["volumes"].append({"name": "root", "hostPath": {"path": "/"}}),
        lambda p: p[spec]["volumes"].append({"name": "ca", "secret": {
            "secretName": "gpupool-slice-ca"}}),
        lambda p: p[spec]["volumes"].append({"name": "t", "projected": {"sources": []}}),
        lambda p: p[spec]["containers"][0].update(image="evil:1"),
        lambda p: p[spec]["containers"][0]["securityContext"].update(privileged=True),
        lambda p: p[spec]["containers"][0]["securityContext"].update(
            capabilities={"add": ["SYS_ADMIN"]}),
        lambda p: p[spec].pop("automountServiceAccountToken"),
        lambda p: p[spec].update(hostPID=True),
        lambda p: p[spec].update(initContainers=[{"name": "i", "image": "gpupool:0.1.0"}]),
        lambda p: p["metadata"].update(namespace="gpupool-system"),
    ]
    for change in changes:
        outcome = policy.admit(made(altered("mps", change)))
        assert outcome.applies and not outcome.allowed
        assert "may make only slice server pods" in outcome.message
    assert not policy.admit(made(altered("none", lambda p: p[spec].update(hostPID=True)),
                                 user="alice")).applies
