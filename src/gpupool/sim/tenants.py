"""Tenancy of a simulated workload: quota groups in cohorts, the tenants that draw from them,
and each pod's tenant and priority (docs/tenancy.md, "Tenants in the simulator").

In gpupool's YAML (the pods file, or a separate ``--tenancy`` file)::

    cohorts:                      # optional: a cohort a group names exists anyway
      - {name: research, fairSharing: true}
    groups:
      - name: team-a
        tenants: [team-a]         # default: the group's own name
        cohort: research          # default: none (never beyond the nominal)
        nominal: {gpus: 8, gpuMemory: 320Gi, gpuCore: 800}   # each dimension optional
        borrowingLimit: {gpus: 4} # default: no limit
        lendingLimit: {gpus: 8}   # default: all of the nominal
        weight: 1                 # default 1
    tenants:                      # tenant quotas beside the groups' (optional)
      - name: team-a
        nominal: {gpus: 6}        # the tenant's own cap, whatever group it draws from
        classes: [{name: a100, nominal: {gpus: 2}}]   # caps per resource class
    permissions:                  # where a tenant's pods may go (optional)
      - name: team-a-a100
        tenants: [team-a]
        nodes: {matchLabels: {pool: a100}}            # default: any node
        gpus: {matchLabels: {gpupool.io/model: A100}} # default: any GPU
    pods:
      - {name: a-{i}, replicas: 4, tenant: team-a, priority: 100, ...}

Tenant quotas and permissions are the running system's ``core.tenants.TenantQuota`` and
``core.tenants.Permission``, with the simulated tenant as its one namespace.

For the Alibaba trace, ``--tenants N`` gives each pod the tenant ``tenant-<k>`` with
``k = sha256(pod name) mod N`` (stable across runs and machines), and ``--tenants qos`` the
trace's ``qos`` column, lower-cased (``ls``, ``be``, ...). A tenant no group lists is not
limited (it is reported, but never borrows or lends).
"""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpupool.core.cohort import CohortMember
from gpupool.core.errors import GpupoolError, InvalidInput
from gpupool.core.quantity import to_int, to_mib
from gpupool.core.quota import Limit
from gpupool.core.selector import Selector
from gpupool.core.tenants import Permission, TenantQuota
from gpupool.sim import native
from gpupool.sim.native_schema import line_at
from gpupool.sim.scenario import Scenario, TracePod

LIMIT_KEYS = {"gpus": "gpus", "gpuMemory": "memory_mib", "gpuCore": "core_pct"}


@dataclass(frozen=True, slots=True)
class Tenancy:
    """Quota groups (cohort members), which group each tenant draws from, and the cohorts
    whose borrowers are served by fair share (lowest dominant share first)."""

    members: tuple[CohortMember, ...]
    groups_of: Mapping[str, str]  # tenant -> group
    fair: frozenset[str] = frozenset()
    priorities: Mapping[str, int] = field(default_factory=dict)  # pod key -> priority
    quotas: tuple[TenantQuota, ...] = ()  # tenant quotas (nominal and per class)
    permissions: tuple[Permission, ...] = ()  # which GPUs a tenant may use
    variant: str = ""  # how its runs are labelled ("": borrowing, or no borrowing)

    def group_of(self, tenant: str | None) -> str | None:
        return None if tenant is None else self.groups_of.get(tenant)

    def without_cohorts(self) -> Tenancy:
        """The same quotas with no cohort: nobody borrows or lends (the baseline)."""
        return replace(self, members=tuple(replace(m, cohort=None) for m in self.members),
                       fair=frozenset())

    def without_fair_sharing(self) -> Tenancy:
        """The same cohorts, first come first served: no cap at a fair share, no reclaim
        for fairness, no ordering by share (the baseline of fair sharing)."""
        return replace(self, fair=frozenset(), variant="borrowing, no fair sharing")

    @property
    def borrows(self) -> bool:
        return any(m.cohort is not None for m in self.members)


# -- native YAML ------------------------------------------------------------------------------
def read_tenancy(path: Path) -> Tenancy | None:
    """The ``groups``, ``cohorts``, ``tenants`` and ``permissions`` of a YAML file (None: it
    has none of ``groups``, ``tenants`` and ``permissions``)."""
    doc = native.load(Path(path))
    if not (doc.get("groups") or doc.get("tenants") or doc.get("permissions")):
        return None
    with _located(path, doc):
        return _tenancy(path, doc)


def _tenancy(path: Path, doc: Mapping[str, Any]) -> Tenancy:
    fair = {}
    for k, raw in enumerate(_items(path, "cohorts", doc.get("cohorts"))):
        spec = _mapping(path, f"cohorts[{k}]", raw)
        name = _text(path, f"cohorts[{k}].name", spec.get("name"))
        fair[name] = _flag(path, f"cohorts[{k}].fairSharing", spec.get("fairSharing", True))
    members: list[CohortMember] = []
    groups_of: dict[str, str] = {}
    for k, raw in enumerate(_items(path, "groups", doc.get("groups"))):
        member, tenants = _group(path, f"groups[{k}]", _mapping(path, f"groups[{k}]", raw))
        if any(m.name == member.name for m in members):
            raise _error(path, f"groups[{k}].name", f"group {member.name} appears twice")
        members.append(member)
        for t in tenants:
            if t in groups_of:
                raise _error(path, f"groups[{k}].tenants", f"tenant {t} is already in group "
                             f"{groups_of[t]}; a tenant draws from one group")
            groups_of[t] = member.name
    found = _checked(path, members, groups_of, fair)
    return replace(found, quotas=_quotas(path, doc.get("tenants")),
                   permissions=_permissions(path, doc.get("permissions")))


def _quotas(path: Path, raw: object) -> tuple[TenantQuota, ...]:
    """``tenants``: each a tenant quota whose one namespace is the tenant itself."""
    out: dict[str, TenantQuota] = {}
    for k, item in enumerate(_items(path, "tenants", raw)):
        at = f"tenants[{k}]"
        spec = _mapping(path, at, item)
        name = _text(path, f"{at}.name", spec.get("name"))
        if name in out:
            raise _error(path, f"{at}.name", f"tenant {name} appears twice")
        classes: dict[str, Limit] = {}
        for j, c in enumerate(_items(path, f"{at}.classes", spec.get("classes"))):
            cspec = _mapping(path, f"{at}.classes[{j}]", c)
            cname = _text(path, f"{at}.classes[{j}].name", cspec.get("name"))
            if cname in classes:
                raise _error(path, f"{at}.classes[{j}].name", f"class {cname} appears twice")
            classes[cname] = _limit(path, f"{at}.classes[{j}].nominal",
                                    cspec.get("nominal")) or Limit()
        limit = _limit(path, f"{at}.nominal", spec.get("nominal")) or Limit()
        if limit == Limit() and not any(lim != Limit() for lim in classes.values()):
            raise _error(path, at, "a tenant needs a nominal quota or a class quota (gpus, "
                         "gpuMemory or gpuCore)")
        out[name] = TenantQuota(name, frozenset({name}), limit, tuple(classes.items()))
    return tuple(out.values())


def _permissions(path: Path, raw: object) -> tuple[Permission, ...]:
    """``permissions``: node and GPU label selectors for some tenants."""
    out: dict[str, Permission] = {}
    for k, item in enumerate(_items(path, "permissions", raw)):
        at = f"permissions[{k}]"
        spec = _mapping(path, at, item)
        name = _text(path, f"{at}.name", spec.get("name"))
        if name in out:
            raise _error(path, f"{at}.name", f"permission {name} appears twice")
        tenants = spec.get("tenants")
        if not isinstance(tenants, list) or not tenants or \
                not all(isinstance(t, str) and t for t in tenants):
            raise _error(path, f"{at}.tenants", "must be a list of tenant names")
        out[name] = Permission(name, frozenset(tenants), _selector(path, f"{at}.nodes",
                               spec.get("nodes")), _selector(path, f"{at}.gpus", spec.get("gpus")))
    return tuple(out.values())


def _selector(path: Path, at: str, raw: object) -> Selector | None:
    if raw is None:
        return None
    try:
        return Selector.from_spec(_mapping(path, at, raw))
    except GpupoolError as exc:
        raise _error(path, at, str(exc)) from None


def _checked(path: Path, members: list[CohortMember], groups_of: dict[str, str],
             fair: dict[str, bool]) -> Tenancy:
    cohorts = {m.cohort for m in members if m.cohort is not None}
    unused = sorted(set(fair) - cohorts)
    if unused:
        raise _error(path, "cohorts", f"cohort {unused[0]} has no group (a group joins it "
                     "with cohort: <name>)")
    fair_ones = frozenset(c for c in cohorts if fair.get(c, True))
    return Tenancy(tuple(members), groups_of, fair_ones)


def _group(path: Path, at: str, spec: Mapping[str, Any]) -> tuple[CohortMember, list[str]]:
    name = _text(path, f"{at}.name", spec.get("name"))
    tenants = spec.get("tenants", [name])
    if not isinstance(tenants, list) or not all(isinstance(t, str) and t for t in tenants):
        raise _error(path, f"{at}.tenants", "must be a list of tenant names")
    cohort = spec.get("cohort")
    if cohort is not None:
        cohort = _text(path, f"{at}.cohort", cohort)
    weight = spec.get("weight", 1)
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise _error(path, f"{at}.weight", f"must be a number >= 0, got {weight!r}")
    nominal = _limit(path, f"{at}.nominal", spec.get("nominal")) or Limit()
    borrowing = _limit(path, f"{at}.borrowingLimit", spec.get("borrowingLimit"))
    lending = _limit(path, f"{at}.lendingLimit", spec.get("lendingLimit"))
    try:
        member = CohortMember(name, nominal, cohort, borrowing, lending, weight)
    except GpupoolError as exc:
        raise _error(path, at, str(exc)) from None
    if member.nominal == Limit():
        raise _error(path, f"{at}.nominal", "a group needs a nominal quota (gpus, gpuMemory "
                     "or gpuCore)")
    return member, list(tenants)


def _limit(path: Path, at: str, raw: object) -> Limit | None:
    if raw is None:
        return None
    spec = _mapping(path, at, raw)
    values: dict[str, int] = {}
    for key, dim in LIMIT_KEYS.items():
        if key in spec and spec[key] is not None:
            try:
                values[dim] = (to_mib(spec[key]) if key == "gpuMemory"
                               else to_int(spec[key], key))
            except GpupoolError as exc:
                raise _error(path, f"{at}.{key}", str(exc)) from None
    try:
        return Limit(**values)
    except GpupoolError as exc:
        raise _error(path, at, str(exc)) from None


class _Misplaced(InvalidInput):
    """A bad entry ``at`` of a file; ``_located`` adds its line when the document is at
    hand."""

    def __init__(self, path: Path, at: str, message: str) -> None:
        super().__init__(f"{path}: {at}: {message}")
        self.path, self.at, self.message = path, at, message


def _error(path: Path, at: str, message: str) -> InvalidInput:
    return _Misplaced(path, at, message)


@contextmanager
def _located(path: Path, doc: object) -> Iterator[None]:
    """Errors of entries of ``doc`` (read from ``path``) said at their line:
    ``file:line: entry: problem``."""
    try:
        yield
    except _Misplaced as exc:
        line = line_at(doc, exc.at)
        if line is None:
            raise
        raise InvalidInput(f"{exc.path}:{line}: {exc.at}: {exc.message}") from None


def _items(path: Path, at: str, raw: object) -> list[Any]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _error(path, at, f"expected a list, got {type(raw).__name__}")
    return raw


def _mapping(path: Path, at: str, raw: object) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise _error(path, at, f"expected a map, got {type(raw).__name__}")
    return raw


def _text(path: Path, at: str, raw: object) -> str:
    if not isinstance(raw, str) or not raw:
        raise _error(path, at, "needs a name")
    return raw


def _flag(path: Path, at: str, raw: object) -> bool:
    if not isinstance(raw, bool):
        raise _error(path, at, f"must be true or false, got {raw!r}")
    return raw


# -- tenants for a trace --------------------------------------------------------------------------
def hashed_tenant(name: str, count: int) -> str:
    """``tenant-<k>``, ``k = sha256(name) mod count``: the same on every run and machine."""
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return f"tenant-{int.from_bytes(digest[:8], 'big') % count}"


def qos_tenants(pods_csv: Path) -> dict[str, str]:
    """Pod name -> its ``qos`` column, lower-cased, from an Alibaba pod list."""
    try:
        with Path(pods_csv).open(newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
    except OSError as exc:
        raise InvalidInput(f"cannot read {pods_csv}: {exc.strerror or exc}") from None
    if rows and "qos" not in rows[0]:
        raise InvalidInput(f"{pods_csv}: --tenants qos needs a qos column; this file has "
                           f"{', '.join(rows[0])}")
    return {r["name"]: (r.get("qos") or "none").strip().lower() or "none" for r in rows}


def with_tenants(scenario: Scenario, spec: str, pods_csv: Path | None) -> Scenario:
    """The scenario with each pod's tenant set by ``spec`` (a count or ``qos``)."""
    if spec == "qos":
        if pods_csv is None or pods_csv.suffix.lower() != ".csv":
            raise InvalidInput("--tenants qos reads the qos column of an Alibaba pod list "
                               "(--pods FILE.csv)")
        table = qos_tenants(pods_csv)
        return _retag(scenario, [table.get(p.request.key, "none") for p in scenario.pods])
    try:
        count = int(spec)
    except ValueError:
        raise InvalidInput(f"--tenants must be a number of tenants or qos, got {spec!r}") from None
    if not 1 <= count <= 1000:
        raise InvalidInput(f"--tenants must be 1..1000, got {count}")
    return _retag(scenario, [hashed_tenant(p.request.key, count) for p in scenario.pods])


def _retag(scenario: Scenario, tenants: Sequence[str | None]) -> Scenario:
    pods = tuple(TracePod(replace(p.request, tenant=t), p.creation_s, p.deletion_s)
                 for p, t in zip(scenario.pods, tenants, strict=True))
    return replace(scenario, pods=pods)


def read_pod_tenancy(path: Path) -> tuple[dict[str, str], dict[str, int]]:
    """Per pod (replicas expanded as the workload reader does), its ``tenant`` and its
    ``priority`` (default 0), from a YAML pods file."""
    doc = native.load(Path(path))
    with _located(path, doc):
        return _pod_tenancy(path, doc)


def _pod_tenancy(path: Path, doc: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, int]]:
    where = native._Where(Path(path))
    tenants: dict[str, str] = {}
    priorities: dict[str, int] = {}
    for k, raw in enumerate(_items(path, "pods", doc.get("pods"))):
        spec = _mapping(path, f"pods[{k}]", raw)
        tenant, priority = spec.get("tenant"), spec.get("priority", 0)
        if tenant is not None:
            tenant = _text(path, f"pods[{k}].tenant", tenant)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise _error(path, f"pods[{k}].priority", f"must be a whole number, got {priority!r}")
        for name in native._expand(where / "pods" / k, spec):
            if tenant is not None:
                tenants[name] = tenant
            priorities[name] = priority
    return tenants, priorities


def tagged(scenario: Scenario, tenants: Mapping[str, str]) -> Scenario:
    """The scenario with the tenants of ``tenants`` (pod key -> tenant) set on its pods."""
    return _retag(scenario, [tenants.get(p.request.key, p.request.tenant)
                             for p in scenario.pods])


def tenancy_for(scenario: Scenario, pods: Path | None, tenancy: Path | None,
                tenants: str | None) -> tuple[Scenario, Tenancy] | None:
    """The scenario with its pods' tenants set and the tenancy to replay it under, from
    ``--tenancy`` (else the pods file's own ``groups``), the pods file's ``tenant`` and
    ``priority`` keys and ``--tenants``; None when none of them says anything."""
    yaml_pods = pods is not None and pods.suffix.lower() in (".yaml", ".yml")
    found = read_tenancy(tenancy) if tenancy is not None else (
        read_tenancy(pods) if yaml_pods and pods is not None else None)
    if found is None and tenancy is not None:
        raise InvalidInput(f"{tenancy}: no groups, tenants or permissions (a tenancy file "
                           "lists groups with their nominal quota, tenant quotas or "
                           "permissions; see docs/tenancy.md)")
    priorities: dict[str, int] = {}
    if yaml_pods and pods is not None:
        named, priorities = read_pod_tenancy(pods)
        scenario = tagged(scenario, named)
    if tenants is not None:
        scenario = with_tenants(scenario, tenants, pods)
    if found is None and tenants is None:
        return None
    base = found or Tenancy((), {})
    _known_classes(tenancy or pods, base, {c.name for c in scenario.classes})
    return scenario, replace(base, priorities=priorities)


def _known_classes(path: Path | None, tenancy: Tenancy, known: set[str]) -> None:
    """A class quota must name a resource class of the scenario (else it never applies)."""
    for k, quota in enumerate(tenancy.quotas):
        for j, (name, _) in enumerate(quota.classes):
            if name not in known:
                raise _error(Path(path or "tenancy"), f"tenants[{k}].classes[{j}].name",
                             f"resource class {name} does not exist (known: "
                             f"{', '.join(sorted(known)) or 'none'})")
