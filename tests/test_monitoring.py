"""The shipped Grafana dashboard and Prometheus alert rules ask only for metrics and labels
gpupool's components register.

Every PromQL expression (each alert's ``expr``, each panel target, each template
variable's ``label_values``) is parsed by a real PromQL parser (``promql-parser``, the
Rust parser of GreptimeDB). Each metric it selects must be a series some component's
registry produces — the names come from the real registries, built by constructing the
extender's, node agent's, webhook's and controller's metrics objects — and each label it
names (in a matcher, ``by``/``without``, ``on``/``ignoring``, ``group_left``/
``group_right``, or an alert's ``$labels``) must exist on the metrics it applies to.
Prometheus adds ``job`` and ``instance`` to every series and serves ``up`` itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import promql_parser as pq
import pytest
import yaml

from gpupool.controller.metrics import ControllerMetrics
from gpupool.extender.metrics import Metrics as ExtenderMetrics
from gpupool.extender.service import Extender, Settings
from gpupool.extender.state.cache import ClusterCache
from gpupool.nodeagent.metrics import NodeMetrics
from gpupool.webhook.metrics import Metrics as WebhookMetrics

REPO = Path(__file__).resolve().parents[1]
FILES = REPO / "charts" / "gpupool" / "files"
TARGET_LABELS = frozenset({"job", "instance"})  # added by Prometheus to every series
BUILTIN = {"up": TARGET_LABELS}  # series Prometheus makes itself


def registered() -> dict[str, frozenset[str]]:
    """Every series name the components' registries produce -> its label names: the
    metrics objects (prometheus_client's map of series names to collectors) and the
    collectors that make their families at scrape time (the extender's tenant quotas)."""
    out: dict[str, frozenset[str]] = dict(BUILTIN)
    extender = Extender(ClusterCache(), Settings("best-fit"), ExtenderMetrics())
    for registry in (extender.metrics.registry, NodeMetrics().registry,
                     WebhookMetrics().registry, ControllerMetrics().registry):
        for series, collector in registry._names_to_collectors.items():
            labels = set(getattr(collector, "_labelnames", ())) | TARGET_LABELS
            if series.endswith("_bucket") and getattr(collector, "_type", "") == "histogram":
                labels.add("le")
            out[series] = frozenset(labels)
        for family in registry.collect():
            if family.type == "gauge" and family.name not in out:
                out[family.name] = frozenset(set(getattr(family, "_labelnames", ())) |
                                             TARGET_LABELS)
    return out


KNOWN = registered()


# -- walking an expression ------------------------------------------------------------------------
@dataclass
class Findings:
    """What an expression uses, and what is wrong with it."""

    metrics: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)


def labels_of(node: Any, known: dict[str, frozenset[str]]) -> set[str]:
    """Label names the series under ``node`` may carry (every metric's, joined)."""
    out: set[str] = set()
    for name in selected(node):
        out |= known.get(name, frozenset())
    return out


def selected(node: Any) -> Iterator[str]:
    """Names of the metrics selected anywhere under ``node``."""
    if isinstance(node, pq.VectorSelector):
        yield node.name or ""
    for child in children(node):
        yield from selected(child)


def children(node: Any) -> list[Any]:
    if isinstance(node, pq.BinaryExpr):
        return [node.lhs, node.rhs]
    if isinstance(node, pq.Call):
        return list(node.args)
    if isinstance(node, pq.MatrixSelector):
        return [node.vector_selector]
    if isinstance(node, (pq.AggregateExpr, pq.ParenExpr, pq.UnaryExpr, pq.SubqueryExpr)):
        return [node.expr] + ([node.param] if isinstance(node, pq.AggregateExpr) and
                              node.param is not None else [])
    return []


def check(expr: str, known: dict[str, frozenset[str]] = KNOWN) -> Findings:
    """Parse ``expr`` and check its metrics and labels against ``known``."""
    found = Findings()
    try:
        tree = pq.parse(expr)
    except (ValueError, RuntimeError) as exc:
        found.problems.append(f"does not parse: {exc}")
        return found
    _walk(tree, known, found)
    return found


def _walk(node: Any, known: dict[str, frozenset[str]], found: Findings) -> None:
    if isinstance(node, pq.VectorSelector):
        _selector(node, known, found)
    elif isinstance(node, pq.AggregateExpr) and node.modifier is not None:
        _clause(f"{node.op} by/without", node.modifier.labels, labels_of(node.expr, known), found)
    elif isinstance(node, pq.BinaryExpr) and node.modifier is not None:
        mod = node.modifier
        if mod.matching is not None:
            both = labels_of(node.lhs, known) & labels_of(node.rhs, known)
            _clause("on/ignoring", mod.matching.labels, both, found)
        one = node.rhs if "ManyToOne" in str(mod.card) else node.lhs
        _clause("group_left/group_right", mod.group_labels or [], labels_of(one, known), found)
    for child in children(node):
        _walk(child, known, found)


def _selector(node: Any, known: dict[str, frozenset[str]], found: Findings) -> None:
    name = node.name or ""
    found.metrics.add(name)
    if name not in known:
        found.problems.append(f"metric {name or '(unnamed)'} is registered by no component")
        return
    for m in node.matchers.matchers:
        if m.name not in known[name] and m.name != "__name__":
            found.problems.append(f"{name} has no label {m.name}")


def _clause(what: str, labels: Any, available: set[str], found: Findings) -> None:
    for label in labels or []:
        if label not in available:
            found.problems.append(f"{what} names label {label}, which none of its metrics has")


# -- the checker itself can fail ----------------------------------------------------------------
TOY = {"a_total": frozenset({"verb", "job", "instance"}), "b": frozenset({"model", "job"}),
       "c_bucket": frozenset({"le", "verb"})}


@pytest.mark.parametrize(("expr", "problem"), [
    ('rate(nope_total[5m])', "metric nope_total is registered by no component"),
    ('sum(rate(a_total{outcome="x"}[5m]))', "a_total has no label outcome"),
    ('sum by (model) (rate(a_total[5m]))', "names label model"),
    ('a_total / on(model) b', "on/ignoring names label model"),
    ('a_total * on(job) group_left(verb) b', "group_left/group_right names label verb"),
    ('histogram_quantile(0.9, sum by (le, pool) (rate(c_bucket[5m])))', "names label pool"),
    ('sum(rate(a_total[5m]) by', "does not parse"),
])
def test_the_checker_finds_unknown_metrics_labels_and_broken_expressions(
        expr: str, problem: str) -> None:
    problems = check(expr, TOY).problems
    assert any(problem in p for p in problems), problems


def test_the_checker_accepts_what_the_metrics_have() -> None:
    good = ('histogram_quantile(0.99, sum by (le, verb) (rate(c_bucket[5m]))) > 1 and on() '
            'absent(b{model="x"}) or sum by (job) (rate(a_total{verb="bind"}[5m])) '
            '/ on(job) group_left(model) max by (job, model) (b)')
    found = check(good, TOY)
    assert found.problems == [] and found.metrics == {"a_total", "b", "c_bucket"}


def test_the_registries_are_read_from_the_real_metrics_objects() -> None:
    assert KNOWN["gpupool_extender_decisions_total"] >= {"verb", "outcome"}
    assert KNOWN["gpupool_node_gpu_healthy"] >= {"gpu"}
    assert "le" in KNOWN["gpupool_controller_reconcile_seconds_bucket"]
    assert KNOWN["gpupool_controller_quota_used_gpus"] >= {"scope", "name"}
    assert "gpupool_webhook_certificate_expiry_timestamp_seconds" in KNOWN
    assert KNOWN["gpupool_tenant_quota"] >= {"tenant", "resource", "kind"}  # made at scrape


# -- the shipped files ----------------------------------------------------------------------------
def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((FILES / "alerts.yaml").read_text())
    assert set(doc) == {"groups"}, "a plain rule file: one top-level key, groups"
    return [rule for g in doc["groups"] for rule in g["rules"]]


def grafana_exprs(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, expr) of every panel target, rows' panels included."""
    stack = list(dashboard["panels"])
    while stack:
        panel = stack.pop()
        stack.extend(panel.get("panels") or [])
        for target in panel.get("targets") or []:
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]


def unvariabled(expr: str) -> str:
    """Grafana's variables replaced as Grafana would: intervals by a duration, the others
    (used in regex matchers) by a regex that matches everything."""
    expr = re.sub(r"\$__(rate_interval|interval|range)\b", "5m", expr)
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def test_every_alert_is_a_complete_rule_on_registered_metrics_and_labels() -> None:
    rules = alert_rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names)) >= 10
    for rule in rules:
        found = check(rule["expr"])
        assert found.problems == [], (rule["alert"], found.problems)
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        assert re.fullmatch(r"\d+[smh]", rule.get("for", "0s")), rule["alert"]
        used = set(re.findall(r"\$labels\.(\w+)", json.dumps(rule["annotations"])))
        available = set().union(*(KNOWN.get(m, frozenset()) for m in found.metrics))
        assert used <= available, (rule["alert"], used - available)


def test_the_alerts_cover_what_an_operator_must_hear_about() -> None:
    exprs = " ".join(r["expr"] for r in alert_rules())
    for metric in ("up", "gpupool_extender_decisions_total", "gpupool_node_gpu_healthy",
                   "gpupool_controller_gpus_stale", "gpupool_node_container_over_use",
                   "gpupool_controller_quota_limit_gpus", "gpupool_controller_gpus_fragmented",
                   "gpupool_controller_is_leader", "gpupool_extender_unverified_decisions_total",
                   "gpupool_webhook_certificate_expiry_timestamp_seconds"):
        assert metric in exprs, metric


def test_the_dashboard_is_grafana_json_with_a_datasource_variable() -> None:
    dash = json.loads((FILES / "grafana-dashboard.json").read_text())
    assert dash["title"] and dash["uid"] and isinstance(dash["schemaVersion"], int)
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = []
    stack = list(dash["panels"])
    while stack:
        panel = stack.pop()
        stack.extend(panel.get("panels") or [])
        ids.append(panel["id"])
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24 and pos["h"] > 0, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"] and panel["description"], panel["title"]
    assert len(ids) == len(set(ids))


def test_every_dashboard_query_names_registered_metrics_and_labels() -> None:
    dash = json.loads((FILES / "grafana-dashboard.json").read_text())
    seen = 0
    for where, expr in grafana_exprs(dash):
        found = check(unvariabled(expr))
        assert found.problems == [], (where, expr, found.problems)
        seen += 1
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", var["definition"])
            assert m is not None and m.group(2) in KNOWN[m.group(1)], var["name"]
    assert seen >= 30


def test_the_operations_guide_documents_every_alert_and_controller_metric() -> None:
    guide = (REPO / "docs" / "operations.md").read_text()
    for rule in alert_rules():
        assert f"`{rule['alert']}`" in guide, rule["alert"]
    for series in ControllerMetrics().registry._names_to_collectors:
        base = re.sub(r"_(bucket|count|sum|created)$", "", series)
        if not series.endswith("_created"):
            assert base in guide, base
