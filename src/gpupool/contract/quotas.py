"""TenantQuota and GPUPermission objects -> core values, or the reason they are broken.

The one reader of these two cluster-scoped custom resources (docs/tenancy.md, the CRDs),
shared by the extender (which enforces them), the controller (which writes their status
and plans automatic groups within permissions) and the admission webhook. It never
raises on a broken object: it returns ``Broken`` with a sentence naming the field.

TenantQuota ``spec``: ``namespaces`` (the tenant's namespaces, by name) and/or
``namespaceSelector`` (namespaces by label: the controller resolves it into
``status.selectedNamespaces``, which this reader adds), ``limits``
(``gpus``, ``memoryMiB``, ``corePct``: the nominal quota, summed over the namespaces),
``classes`` (a map class name -> the same three limits), and for cohorts ``cohort``,
``borrowingLimit``, ``lendingLimit`` (same three limits), ``weight`` (a whole number) and
``fairSharing`` (true: the cohort divides what it lends by weight; one member saying so is
enough).

GPUPermission ``spec``: ``tenants`` (namespaces), ``nodeSelector`` (a label selector over
node labels) and ``gpuSelector`` (a label selector over GPU labels, as ResourceClass).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpupool.contract.tenancy import MEMBER_RULES, QUOTA_KEYS, Broken
from gpupool.core.classes import check_class_name
from gpupool.core.errors import InvalidInput
from gpupool.core.quota import Limit
from gpupool.core.selector import Selector
from gpupool.core.tenants import Permission, TenantQuota

QUOTA_FIELDS = ("namespaces", "namespaceSelector", "limits", "classes", "cohort",
                "borrowingLimit", "lendingLimit", "weight", "fairSharing")
PERMISSION_FIELDS = ("tenants", "nodeSelector", "gpuSelector")
MAX_WEIGHT = 1_000_000

__all__ = ["Broken", "permission_of", "permission_or_denial", "quota_of"]


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("name") or "") if isinstance(meta, Mapping) else ""


def _spec(obj: Mapping[str, Any], known: tuple[str, ...]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    if spec is None:
        return {}
    if not isinstance(spec, Mapping):
        raise InvalidInput("spec must be an object")
    unknown = sorted(str(k) for k in set(spec) - set(known))
    if unknown:
        raise InvalidInput(f"spec has unknown fields {', '.join(unknown)} "
                           f"(known: {', '.join(known)})")
    return spec


def quota_of(obj: Mapping[str, Any]) -> TenantQuota | Broken:
    """The tenant quota ``obj`` defines, or why it cannot be used."""
    name = _name(obj)
    try:
        spec = _spec(obj, QUOTA_FIELDS)
        return TenantQuota(
            name, _namespaces(spec, "namespaces") | selected_namespaces(obj),
            _limit(spec, "limits") or Limit(),
            _classes(spec.get("classes")), _cohort(spec.get("cohort")),
            _limit(spec, "borrowingLimit"), _limit(spec, "lendingLimit"),
            _weight(spec.get("weight")),
            _selector(spec.get("namespaceSelector"), "namespaceSelector"),
            _flag(spec.get("fairSharing"), "fairSharing"))
    except InvalidInput as exc:
        return Broken("InvalidSpec", f"TenantQuota {name}: {exc}; fix it (until then the "
                      "quota is not enforced and its namespaces are not limited by it)")


def selected_namespaces(obj: Mapping[str, Any]) -> frozenset[str]:
    """The namespaces the controller found ``spec.namespaceSelector`` to match
    (``status.selectedNamespaces``; only the controller may write status). Names that are no
    namespace names are left out."""
    status = obj.get("status")
    found = status.get("selectedNamespaces") if isinstance(status, Mapping) else None
    if not isinstance(found, list):
        return frozenset()
    pattern, _ = MEMBER_RULES["tenants"]
    return frozenset(n for n in found if isinstance(n, str) and pattern.match(n))


def permission_of(obj: Mapping[str, Any]) -> Permission | Broken:
    """The permission ``obj`` defines, or why it cannot be used."""
    name = _name(obj)
    try:
        spec = _spec(obj, PERMISSION_FIELDS)
        return Permission(name, _namespaces(spec, "tenants"),
                          _selector(spec.get("nodeSelector"), "nodeSelector"),
                          _selector(spec.get("gpuSelector"), "gpuSelector"))
    except InvalidInput as exc:
        return Broken("InvalidSpec", f"GPUPermission {name}: {exc}; fix it (until then it "
                      "permits nothing: its tenants may use only what other permissions "
                      "naming them permit)")


def permission_or_denial(obj: Mapping[str, Any]) -> Permission | Broken:
    """What to enforce for ``obj``: its permission, or — when it is broken but its tenants
    can be read — a permission that permits those tenants nothing (a broken permission
    never widens what a tenant may use). ``Broken`` when not even the tenants are known."""
    found = permission_of(obj)
    if not isinstance(found, Broken):
        return found
    spec = obj.get("spec")
    try:
        tenants = _namespaces(spec if isinstance(spec, Mapping) else {}, "tenants")
    except InvalidInput:
        return found
    return Permission(_name(obj), tenants, broken=found.message) if tenants else found


def _namespaces(spec: Mapping[str, Any], key: str) -> frozenset[str]:
    value = spec.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidInput(f"spec.{key} must be a list of namespace names, got {value!r}")
    pattern, what = MEMBER_RULES["tenants"]
    for i, ns in enumerate(value):
        if not pattern.match(ns):
            raise InvalidInput(f"spec.{key}[{i}] {ns[:80]!r} is not {what}")
    return frozenset(value)


def _limit(spec: Mapping[str, Any], key: str) -> Limit | None:
    raw = spec.get(key)
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise InvalidInput(f"spec.{key} must be an object with {', '.join(QUOTA_KEYS)}")
    unknown = sorted(str(k) for k in set(raw) - set(QUOTA_KEYS))
    if unknown:
        raise InvalidInput(f"spec.{key} has unknown keys {', '.join(unknown)} "
                           f"(known: {', '.join(QUOTA_KEYS)})")
    values = []
    for dim in QUOTA_KEYS:
        v = raw.get(dim)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise InvalidInput(f"spec.{key}.{dim} must be a whole number >= 0, got {v!r}")
        values.append(v)
    return Limit(*values)


def _classes(raw: Any) -> tuple[tuple[str, Limit], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise InvalidInput("spec.classes must be a map of class name -> limits")
    out = []
    for cls in sorted(raw, key=str):
        check_class_name(str(cls))
        limit = _limit({f"classes.{cls}": raw[cls]}, f"classes.{cls}")
        out.append((str(cls), limit or Limit()))
    return tuple(out)


def _cohort(raw: Any) -> str | None:
    if raw is None or raw == "":
        return None
    pattern, _ = MEMBER_RULES["tenants"]
    if not isinstance(raw, str) or not pattern.match(raw):
        raise InvalidInput(f"spec.cohort {raw!r} must be 1-63 lower-case letters, digits "
                           "and '-'")
    return raw


def _weight(raw: Any) -> int:
    if raw is None:
        return 1
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= MAX_WEIGHT:
        raise InvalidInput(f"spec.weight must be a whole number from 0 to {MAX_WEIGHT}, "
                           f"got {raw!r}")
    return raw


def _flag(raw: Any, key: str) -> bool:
    if raw is None:
        return False
    if not isinstance(raw, bool):
        raise InvalidInput(f"spec.{key} must be true or false, got {raw!r}")
    return raw


def _selector(raw: Any, key: str) -> Selector | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise InvalidInput(f"spec.{key} must be a label selector (matchLabels and/or "
                           "matchExpressions)")
    try:
        return Selector.from_spec(raw)
    except InvalidInput as exc:
        raise InvalidInput(f"spec.{key}: {exc}") from None
