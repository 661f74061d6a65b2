"""ResourceClass and ResourceGroup objects -> core values, or the reason they are broken.

The one reader of these two custom resources for the components that judge them: the
controller (which writes their ``status``) and the admission webhook (which refuses a
broken one before it is stored) say the same thing about the same object.

The spec shapes (docs/protocol.md, the CRDs): a class has ``spec.selector`` (a label
selector over GPU labels, parsed by ``core.selector``: Gt/Lt values are Kubernetes
quantities); a group has ``spec.nodes`` (node names), ``spec.gpus`` (GPU uuids),
``spec.tenants`` (namespaces), ``spec.models`` (GPU models), each a list of strings,
and optionally ``spec.quota`` with whole numbers ``gpus``, ``memoryMiB``, ``corePct``.
With ``spec.mode: automatic`` the members are the GPUs the controller planned
(``status.members.gpus``, ``automatic_of`` reads the planning spec).
The core constructors do the validating; this module reaches into the dicts, checks
that names are names Kubernetes could ever hold (a tenant that is no valid namespace
name can never match a pod), and says which field is wrong.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.core.classes import ResourceClass, check_class_name
from gpupool.core.errors import InvalidInput
from gpupool.core.groupplan import AutoGroup
from gpupool.core.groups import ResourceGroup
from gpupool.core.quota import Limit
from gpupool.core.selector import Selector

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # RFC 1123 label: a namespace
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")  # RFC 1123 subdomain: a node
_PRINTABLE = re.compile(r"^[!-~]{1,256}$")  # no space or control character (uuids, models)
MEMBER_RULES = {
    "nodes": (_SUBDOMAIN, "a node name (lower-case letters, digits, '-' and '.')"),
    "tenants": (_LABEL, "a namespace name (1-63 lower-case letters, digits and '-')"),
    "gpus": (_PRINTABLE, "a GPU uuid (printable characters, no spaces)"),
    "models": (_PRINTABLE, "a GPU model as GPUDevices publish it (no spaces)"),
}
QUOTA_KEYS = ("gpus", "memoryMiB", "corePct")


@dataclass(frozen=True, slots=True)
class Broken:
    """Why an object cannot be used: a CamelCase reason and a sentence."""

    reason: str
    message: str


def _spec(obj: Mapping[str, Any], kind: str, name: str) -> Mapping[str, Any]:
    spec = obj.get("spec")
    if spec is None:
        return {}
    if not isinstance(spec, Mapping):
        raise InvalidInput(f"{kind} {name}: spec must be an object")
    return spec


def class_of(obj: Mapping[str, Any], name: str) -> ResourceClass | Broken:
    """The class ``obj`` defines, or why it cannot be used."""
    try:
        check_class_name(name)
    except InvalidInput as exc:
        return Broken("InvalidName", f"{exc}; pods cannot name this class in "
                      "class.gpupool.io/<class>: recreate it under a valid name")
    try:
        selector = _spec(obj, "ResourceClass", name).get("selector") or {}
        if not isinstance(selector, Mapping):
            raise InvalidInput("spec.selector must be an object with matchLabels and/or "
                               "matchExpressions")
        return ResourceClass(name, Selector.from_spec(selector))
    except InvalidInput as exc:
        return Broken("InvalidSelector", f"{exc}; fix spec.selector (pods asking for "
                      f"class.gpupool.io/{name} are refused until then)")


def group_of(obj: Mapping[str, Any], name: str) -> tuple[ResourceGroup, Limit | None] | Broken:
    """The group ``obj`` defines and its quota (None: no quota), or why it cannot be used."""
    try:
        spec = _spec(obj, "ResourceGroup", name)
        group = ResourceGroup(name, *(_names(spec, key) for key in
                                      ("nodes", "gpus", "tenants", "models")))
        if is_automatic(obj):  # members: what the controller planned (status.members)
            group = ResourceGroup(name, frozenset(), planned_members(obj), group.tenants,
                                  group.models)
        return group, _limit(spec.get("quota"))
    except InvalidInput as exc:
        return Broken("InvalidSpec", f"{exc}; fix the ResourceGroup (pods naming group {name} "
                      "are refused until then)")


def _names(spec: Mapping[str, Any], key: str) -> frozenset[str]:
    value = spec.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidInput(f"spec.{key} must be a list of strings, got {value!r}")
    pattern, what = MEMBER_RULES[key]
    for i, member in enumerate(value):
        if member and not pattern.match(member):
            raise InvalidInput(f"spec.{key}[{i}] {member[:80]!r} is not {what}")
    return frozenset(value)


def _limit(quota: Any) -> Limit | None:
    if quota is None:
        return None
    if not isinstance(quota, Mapping):
        raise InvalidInput(f"spec.quota must be an object, got {quota!r}")
    unknown = sorted(set(quota) - set(QUOTA_KEYS))
    if unknown:
        raise InvalidInput(f"spec.quota has unknown keys {', '.join(map(str, unknown))} "
                           f"(known: {', '.join(QUOTA_KEYS)})")
    return Limit(*(_whole(quota, key) for key in QUOTA_KEYS))


def _whole(quota: Mapping[str, Any], key: str) -> int | None:
    value = quota.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"spec.quota.{key} must be a whole number, got {value!r}")
    return value


# -- automatic groups ---------------------------------------------------------------------------
AUTOMATIC = "automatic"


def is_automatic(obj: Mapping[str, Any]) -> bool:
    spec = obj.get("spec")
    return isinstance(spec, Mapping) and spec.get("mode") == AUTOMATIC


def planned_members(obj: Mapping[str, Any]) -> frozenset[str]:
    """The GPU uuids the controller chose for an automatic group (``status.members.gpus``;
    none while it has not planned, or when the status cannot be read)."""
    status = obj.get("status")
    members = status.get("members") if isinstance(status, Mapping) else None
    gpus = members.get("gpus") if isinstance(members, Mapping) else None
    if not isinstance(gpus, list):
        return frozenset()
    return frozenset(u for u in gpus if isinstance(u, str) and _PRINTABLE.match(u))


def automatic_of(obj: Mapping[str, Any], name: str) -> AutoGroup | Broken:
    """An automatic group's planning spec, or why it cannot be planned."""
    try:
        spec = _spec(obj, "ResourceGroup", name)
        demand = spec.get("demand")
        if not isinstance(demand, Mapping):
            raise InvalidInput("spec.demand must be an object with gpus or sharePct")
        gpus, share = demand.get("gpus"), demand.get("sharePct")
        for key, v in (("gpus", gpus), ("sharePct", share)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise InvalidInput(f"spec.demand.{key} must be a whole number, got {v!r}")
        raw = spec.get("nodeSelector")
        if raw is not None and not isinstance(raw, Mapping):
            raise InvalidInput("spec.nodeSelector must be a label selector")
        shareable = spec.get("shareable", False)
        if not isinstance(shareable, bool):
            raise InvalidInput(f"spec.shareable must be true or false, got {shareable!r}")
        return AutoGroup(name, _names(spec, "tenants"), _names(spec, "models"), gpus, share,
                         None if raw is None else Selector.from_spec(raw), shareable)
    except InvalidInput as exc:
        return Broken("InvalidSpec", f"{exc}; fix the ResourceGroup (its members are kept as "
                      "they are until then)")
