"""Every manifest in deploy/ parses, and the CRDs and scheduler config carry what the code
reads and writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from gpupool.contract import names
from gpupool.core.allocation import Allocation
from gpupool.core.selector import Operator
from gpupool.extender.bind.gate import DEFAULT_SCHEDULER
from gpupool.extender.edge.app import build_verbs
from gpupool.extender.edge.tls import CLIENT_SECRET, SERVICE
from gpupool.extender.metrics import Metrics
from gpupool.extender.service import Extender, Settings
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.state.ledger import BIND, HOLD, Entry
from gpupool.security.certs import service_names

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NAMESPACE = "gpupool-system"
YAMLS = sorted(DEPLOY.rglob("*.yaml"))


def docs_of(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def crd(plural: str) -> dict[str, Any]:
    for path in YAMLS:
        for doc in docs_of(path):
            if doc.get("kind") == "CustomResourceDefinition" and \
                    doc["spec"]["names"]["plural"] == plural:
                return doc
    raise AssertionError(f"no CRD for {plural} in {DEPLOY}")


def schema(plural: str) -> dict[str, Any]:
    (version,) = crd(plural)["spec"]["versions"]
    assert version["name"] == names.API_VERSION.split("/")[1] and version["storage"]
    return version["schema"]["openAPIV3Schema"]["properties"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("path", YAMLS, ids=[str(p.relative_to(DEPLOY)) for p in YAMLS])
def test_every_manifest_parses_into_kubernetes_objects(path: Path) -> None:
    docs = docs_of(path)
    assert docs
    for doc in docs:
        assert doc.get("apiVersion") and doc.get("kind") and doc["metadata"].get("name")


def test_the_crds_are_cluster_scoped_in_the_gpupool_group() -> None:
    for plural in ("gpudevices", "resourceclasses", "resourcegroups", "gpuledgers"):
        spec = crd(plural)["spec"]
        assert spec["group"] == names.GROUP and spec["scope"] == "Cluster"


def test_the_gpudevice_schema_has_every_field_the_extender_reads() -> None:
    props = schema("gpudevices")
    spec = props["spec"]["properties"]
    assert {"node", "uuid", "index", "model", "memoryMiB", "architecture", "numaNode",
            "labels"} <= set(spec)
    assert {"health", "reason", "heartbeatTime"} <= set(props["status"]["properties"])
    assert props["status"]["properties"]["health"]["enum"] == ["Healthy", "Unhealthy"]


def test_the_resource_class_selector_allows_every_operator() -> None:
    selector = schema("resourceclasses")["spec"]["properties"]["selector"]["properties"]
    ops = selector["matchExpressions"]["items"]["properties"]["operator"]["enum"]
    assert set(ops) == {o.value for o in Operator}
    assert "matchLabels" in selector


def test_the_resource_group_has_members_tenants_and_quota() -> None:
    spec = schema("resourcegroups")["spec"]["properties"]
    assert {"nodes", "gpus", "tenants", "models", "quota"} <= set(spec)
    assert set(spec["quota"]["properties"]) == {"gpus", "memoryMiB", "corePct"}


def test_the_ledger_schema_keeps_every_field_an_entry_writes() -> None:
    entry = Entry(Allocation("uid", "n1", 0, 0), "ns/p", "2026-01-01T00:00:00Z", "ns")
    hold = Entry(Allocation("uid", "n1", 0, 0), "ns/p", "2026-01-01T00:00:00Z", "ns",
                 kind=HOLD, expires="2026-01-01T00:02:00Z", displaces=("victim",))
    fields = schema("gpuledgers")["spec"]["properties"]["entries"]["additionalProperties"]
    assert set(entry.to_json()) <= set(fields["properties"])
    assert set(hold.to_json()) <= set(fields["properties"])  # nothing pruned by the API
    assert fields["properties"]["kind"]["enum"] == [BIND, HOLD]
    assert fields["properties"]["displaces"]["items"]["type"] == "string"


def scheduler_config() -> dict[str, Any]:
    (cm,) = docs_of(DEPLOY / "extender" / "scheduler-config.yaml")
    config: dict[str, Any] = yaml.safe_load(cm["data"]["scheduler-config.yaml"])
    return config


def test_the_scheduler_config_calls_the_extender_for_gpupool_resources() -> None:
    config = scheduler_config()
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert config["profiles"][0]["schedulerName"] == DEFAULT_SCHEDULER
    ext, claims = config["extenders"]
    assert ext["nodeCacheCapable"] is True and ext["ignorable"] is False
    managed = {m["name"]: m["ignoredByScheduler"] for m in ext["managedResources"]}
    assert managed[names.RESOURCE_MEMORY] is True and managed[names.RESOURCE_CORE] is True
    assert managed[names.RESOURCE_GPU] is False  # the node agent advertises it
    assert all(v for k, v in managed.items() if k.startswith(names.CLASS_RESOURCE_PREFIX))
    routes = build_verbs(Extender(ClusterCache(), Settings("best-fit"), Metrics())).paths()
    verbs = ("filterVerb", "prioritizeVerb", "bindVerb", "preemptVerb")
    assert {"/" + ext[v] for v in verbs} <= routes
    # the DRA entry: every pod (no managedResources); filter (tenancy of claims) and
    # prioritize, blocking like the main entry while no extender answers (docs/dra.md)
    assert {"/" + claims[v] for v in ("filterVerb", "prioritizeVerb")} <= routes
    assert claims["filterVerb"] == "filter-claims" and claims["ignorable"] is False
    assert not {"bindVerb", "preemptVerb", "managedResources"} & set(claims)
    assert {k: claims[k] for k in ("urlPrefix", "tlsConfig", "weight")} == {
        k: ext[k] for k in ("urlPrefix", "tlsConfig", "weight")}


def test_the_extender_rbac_grants_what_it_calls_and_no_pod_writes() -> None:
    role = next(d for d in docs_of(DEPLOY / "extender" / "rbac.yaml") if d["kind"] == "ClusterRole")
    grants = {(g, r): set(rule["verbs"]) for rule in role["rules"]
              for g in rule["apiGroups"] for r in rule["resources"]}
    assert grants["", "pods/binding"] == {"create"}
    assert grants["", "pods/eviction"] == {"create"} and grants["", "events"] == {"create"}
    assert grants["policy", "poddisruptionbudgets"] == {"get", "list", "watch"}
    assert grants["", "pods"] == {"get", "list", "watch"}
    assert grants["gpupool.io", "gpuledgers"] >= {"create", "patch", "get", "list", "watch"}
    assert "patch" not in grants["gpupool.io", "gpudevices"]


def doc(path: str, kind: str) -> dict[str, Any]:
    return next(d for d in docs_of(DEPLOY / "extender" / path) if d["kind"] == kind)


def test_the_scheduler_calls_the_extender_over_mutual_tls_with_the_mounted_secret() -> None:
    ext = scheduler_config()["extenders"][0]
    assert ext["enableHTTPS"] is True and ext["tlsConfig"]["insecure"] is False
    url = urlparse(ext["urlPrefix"])
    assert url.scheme == "https" and url.hostname in service_names(SERVICE, NAMESPACE)
    deployment = doc("deployment.yaml", "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert f"--port={ports['https']}" in container["args"] and url.port == ports["https"]
    assert container["livenessProbe"]["httpGet"]["port"] == "probes"
    scheduler = doc("scheduler.yaml", "Deployment")["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in scheduler["containers"][0]["volumeMounts"]}
    secret = next(v for v in scheduler["volumes"] if "secret" in v)
    assert secret["secret"]["secretName"] == CLIENT_SECRET
    folder = mounts[secret["name"]]
    assert {ext["tlsConfig"][k] for k in ("certFile", "keyFile", "caFile")} == {
        f"{folder}/tls.crt", f"{folder}/tls.key", f"{folder}/ca.crt"}
    assert not any("subPath" in m for m in scheduler["containers"][0]["volumeMounts"])


def test_the_network_policy_lets_only_the_scheduler_reach_the_verbs() -> None:
    policy = doc("networkpolicy.yaml", "NetworkPolicy")["spec"]
    assert policy["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": SERVICE}
    assert policy["policyTypes"] == ["Ingress"]
    verbs = [r for r in policy["ingress"] if {p["port"] for p in r["ports"]} == {8443}]
    (rule,) = verbs
    scheduler_labels = doc("scheduler.yaml", "Deployment")["spec"]["template"]["metadata"][
        "labels"]
    (source,) = rule["from"]
    assert source["podSelector"]["matchLabels"].items() <= scheduler_labels.items()
    others = [r for r in policy["ingress"] if r is not rule]
    assert all({p["port"] for p in r["ports"]} == {8080} for r in others)


def test_the_network_policy_admits_no_pod_but_prometheus_to_the_probe_port() -> None:
    """A rule without ``from`` admits every source: each probe-port rule names its
    sources, and they are in a namespace no tenant can name (the API server sets
    kubernetes.io/metadata.name); the kubelet's probes come from the node, always
    admitted (and the probe port recycles connections besides: test_probe_port)."""
    policy = doc("networkpolicy.yaml", "NetworkPolicy")["spec"]
    probes = [r for r in policy["ingress"] if {p["port"] for p in r["ports"]} == {8080}]
    assert probes and all(r.get("from") for r in probes)
    for rule in probes:
        for source in rule["from"]:
            assert set(source) == {"namespaceSelector"}
            assert set(source["namespaceSelector"]["matchLabels"]) == {
                "kubernetes.io/metadata.name"}
