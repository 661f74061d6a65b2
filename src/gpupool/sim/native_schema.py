"""The keys gpupool's YAML files for the simulator may hold (``gpupool.contract.yamlcheck``).

Every key a reader understands is listed here; anything else is an error that names
the file, the line and the closest known key. A new key is one line in its map.
``loaded_text`` loads a file's text with PyYAML, checked against a shape.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import yaml

from gpupool.contract.yamlcheck import (
    FLAG,
    NUMBER,
    QUANTITY,
    SCALAR,
    TEXT,
    Map,
    OneOf,
    Seq,
    Shape,
    Value,
    load_text,
)

LABELS = Map({}, others=SCALAR)
SELECTOR = Map({
    "matchLabels": LABELS,
    "matchExpressions": Seq(Map({"key": TEXT, "operator": TEXT, "values": Seq(SCALAR)},
                                required=frozenset({"key", "operator"}))),
})
GPU_FIELDS: dict[str, Shape] = {
    "model": TEXT,
    "memory": QUANTITY,
    "healthy": FLAG,
    "labels": LABELS,
}
GPU = Map(GPU_FIELDS, required=frozenset({"model", "memory"}))
GPU_GROUP = Map({**GPU_FIELDS, "count": QUANTITY}, required=frozenset({"model", "memory"}))
NODE = Map({
    "name": TEXT,
    "replicas": QUANTITY,
    "cpu": QUANTITY,
    "memory": QUANTITY,
    "labels": LABELS,
    "gpus": OneOf((Seq(GPU), GPU_GROUP)),
}, required=frozenset({"name", "cpu", "memory"}))
RESOURCE_CLASS = Map({"name": TEXT, "selector": SELECTOR}, required=frozenset({"name"}))
CONTAINER = Map({
    "name": TEXT,
    "gpu": QUANTITY,
    "gpuMemory": QUANTITY,
    "gpuCore": QUANTITY,
    "mode": TEXT,
})
POD = Map({
    "name": TEXT,
    "replicas": QUANTITY,
    "cpu": QUANTITY,
    "memory": QUANTITY,
    "containers": Seq(CONTAINER),
    "models": OneOf((Seq(TEXT), TEXT)),
    "selector": SELECTOR,
    "affinity": TEXT,
    "class": TEXT,
    "creation": NUMBER,
    "deletion": NUMBER,
    "tenant": TEXT,
    "priority": Value(frozenset({"int"}), "a whole number"),
}, required=frozenset({"name"}))
QUOTA_LIMIT = Map({"gpus": QUANTITY, "gpuMemory": QUANTITY, "gpuCore": QUANTITY})
GROUP = Map({
    "name": TEXT,
    "tenants": Seq(TEXT),
    "cohort": TEXT,
    "nominal": QUOTA_LIMIT,
    "borrowingLimit": QUOTA_LIMIT,
    "lendingLimit": QUOTA_LIMIT,
    "weight": NUMBER,
}, required=frozenset({"name", "nominal"}))
COHORT = Map({"name": TEXT, "fairSharing": FLAG}, required=frozenset({"name"}))
TENANT_CLASS = Map({"name": TEXT, "nominal": QUOTA_LIMIT}, required=frozenset({"name", "nominal"}))
TENANT = Map({
    "name": TEXT,
    "nominal": QUOTA_LIMIT,
    "classes": Seq(TENANT_CLASS),
}, required=frozenset({"name"}))
PERMISSION = Map({
    "name": TEXT,
    "tenants": Seq(TEXT),
    "nodes": SELECTOR,
    "gpus": SELECTOR,
}, required=frozenset({"name", "tenants"}))
"""Quota groups and cohorts of simulated tenants (``gpupool.sim.tenants``)."""
NATIVE = Map({
    "nodes": Seq(NODE),
    "classes": Seq(RESOURCE_CLASS),
    "pods": Seq(POD),
    "groups": Seq(GROUP),
    "cohorts": Seq(COHORT),
    "tenants": Seq(TENANT),
    "permissions": Seq(PERMISSION),
})
"""A cluster and/or workload file (``gpupool.sim.native``)."""

WEIGHTS = Map({}, others=NUMBER)
MIX = Map({
    "name": TEXT,
    "about": TEXT,
    "constrained": NUMBER,
    "models": WEIGHTS,
    "classes": WEIGHTS,
    "shares": WEIGHTS,
    "cpu_scale": NUMBER,
    "memory_scale": NUMBER,
    "pods": Value(frozenset({"int"}), "a whole number"),
    "seed": Value(frozenset({"int"}), "a whole number"),
    "cpu_nodes": Value(frozenset({"int"}), "a whole number"),
    "zones": Value(frozenset({"int"}), "a whole number"),
}, required=frozenset({"name"}))
MIXES = Map({"mixes": Seq(MIX)})
"""A mix file (``gpupool.sim.generate``)."""

class Marked(dict[Any, Any]):
    """A map as read from a file, with the line (from 1) where it starts and where each of
    its keys is, so that a bad value found later is said with its line."""

    def __init__(self, line: int = 0) -> None:
        super().__init__()
        self.line = line
        self.lines: dict[Any, int] = {}


class MarkedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, whose maps are ``Marked``."""


def _marked_map(loader: MarkedLoader, node: yaml.MappingNode) -> Iterator[Marked]:
    data = Marked(node.start_mark.line + 1)
    yield data  # first, as PyYAML's own map constructor does, for maps that hold themselves
    data.update(loader.construct_mapping(node))  # merge keys resolved here
    data.lines = {key.value: key.start_mark.line + 1 for key, _ in node.value
                  if isinstance(key, yaml.ScalarNode)}


MarkedLoader.add_constructor("tag:yaml.org,2002:map", _marked_map)

_STEP = re.compile(r"\[(\d+)\]|\.?([^.\[\]]+)")


def line_at(doc: object, at: str) -> int | None:
    """The line (from 1) of the entry ``at`` (``groups[0].nominal.gpus``) in ``doc`` as
    read with ``MarkedLoader``: the line of its key, else of the nearest map above it that
    was read; None when nothing on the way carries a line."""
    line: int | None = getattr(doc, "line", None) or None
    node = doc
    for index, key in _STEP.findall(at):
        if key and isinstance(node, Marked) and key in node:
            line = node.lines.get(key) or line
            node = node[key]
        elif index and isinstance(node, list) and int(index) < len(node):
            node = node[int(index)]
            line = getattr(node, "line", None) or line
        else:
            break
    return line


def loaded_text(text: str, file: str, shape: Shape = NATIVE) -> Any:
    """The document in ``text``, its maps ``Marked``; ``YamlProblems`` (every problem,
    ``file:line:col: ...``) unless it is well-formed YAML of ``shape``."""
    return load_text(text, file, shape, MarkedLoader, yaml.YAMLError)
