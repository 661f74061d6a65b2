"""The chart with remote GPU slices on: the slices' namespace, the controller's and the
webhook's flags, the NetworkPolicy of the servers, and the admission policy confining the
controller's Secret writes outside that namespace (its CEL evaluated)."""

from __future__ import annotations

from typing import Any

import pytest

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
    assert "--slice-namespace=gpupool-slices" in agent["containers"][0]["args"]
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
                  "remote.server.lupineCommand=/opt/lupine/server")
    args = container(docs, "Deployment", "gpupool-controller")["args"]
    assert {"--slice-server-image=reg.example/lupine-gp:1",
            "--lupine-server-command=/opt/lupine/server",
            "--lupine-server-env=SCUDA_PORT={port}"} <= set(args)


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
