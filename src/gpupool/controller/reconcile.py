"""What the world should look like: observed objects in, a ``Plan`` of writes out.

Pure and deterministic (``now`` is passed in): the loop applies the plan, and
reconciling the resulting world again yields an empty plan. The steps:

1. default classes (``defaults``): create the missing one per GPU model,
   bring controller-owned ones back to their spec, delete owned ones whose
   models are gone (unless a live pod still holds GPUs of that class);
   classes made by anyone else are never changed;
2. every ResourceClass gets ``status``: ``Valid``, the GPUs it selects, and
   what is allocated of it per tenant;
3. every ResourceGroup gets ``status``: ``Valid``, ``WithinQuota``, its member
   GPUs, and allocated / limit / remaining per the core's quota arithmetic;
4. pods whose decision cannot be read are listed on the class and group they
   name (their share is missing from the numbers) and in ``Plan.notes``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpupool.contract import annotations as records
from gpupool.contract.podspec_request import gpu_class_of
from gpupool.controller.defaults import ANNOTATION_MODELS, default_classes, is_owned
from gpupool.controller.groupsync import PLANNED_KEYS
from gpupool.controller.observed import (
    Obj,
    Observed,
    PodHolding,
    name_of,
)
from gpupool.controller.resources import Broken, class_of, group_of
from gpupool.controller.status import (
    MAX_LISTED,
    Verdict,
    amount_json,
    conditions,
    limit_json,
    merge_diff,
)
from gpupool.core.classes import ResourceClass
from gpupool.core.groups import ResourceGroup
from gpupool.core.model import Gpu
from gpupool.core.quota import Amount, Charge, Limit, QuotaBook, amount_of_allocation

CLASS = "ResourceClass"
GROUP = "ResourceGroup"


@dataclass(frozen=True, slots=True)
class CreateClass:
    obj: Obj


@dataclass(frozen=True, slots=True)
class PatchClass:
    name: str
    patch: Obj
    resource_version: str | None


@dataclass(frozen=True, slots=True)
class DeleteClass:
    name: str


@dataclass(frozen=True, slots=True)
class PatchStatus:
    kind: str  # CLASS or GROUP
    name: str
    patch: Obj


Action = CreateClass | PatchClass | DeleteClass | PatchStatus


@dataclass(frozen=True, slots=True)
class Plan:
    """The writes to make, in order, and what a person should know."""

    actions: tuple[Action, ...] = ()
    notes: tuple[str, ...] = field(default=())


def reconcile(observed: Observed, now: str) -> Plan:
    """The plan that brings the cluster's custom resources in line with ``observed``."""
    class_actions, classes, notes = _default_classes(observed)
    book = _charged_book(observed)
    statuses: list[Action] = []
    kinds = gpu_kinds(observed)
    for obj in classes:
        statuses += _status_action(CLASS, obj, class_status(obj, observed, now, kinds))
    for obj in sorted(observed.groups, key=name_of):
        statuses += _status_action(GROUP, obj, group_status(obj, observed, book, now))
    notes += [f"{p.kind} {p.name}: {p.message}" for p in observed.problems]
    return Plan(tuple(class_actions + statuses), tuple(notes))


def _status_action(kind: str, obj: Obj, desired: Obj) -> list[Action]:
    patch = merge_diff(obj.get("status") or {}, desired)
    return [PatchStatus(kind, name_of(obj), patch)] if patch else []


# -- 1. default classes ------------------------------------------------------------------------
def _default_classes(observed: Observed) -> tuple[list[Action], list[Obj], list[str]]:
    """(actions, the classes as they will be, notes)."""
    wanted = default_classes({g.gpu.model for g in observed.gpus})
    held = {h.gpu_class for h in observed.holdings}
    actions: list[Action] = []
    notes: list[str] = []
    after: list[Obj] = []
    existing = {name_of(c): c for c in observed.classes}
    for name, have in sorted(existing.items()):
        want = wanted.get(name)
        if not is_owned(have):
            if want is not None:
                models = want["metadata"]["annotations"][ANNOTATION_MODELS]
                notes.append(f"ResourceClass {name} was not made by the controller: left as "
                             f"it is, so GPU model(s) {models} get no default class")
            after.append(have)
        elif want is None and name not in held:
            actions.append(DeleteClass(name))
        elif want is None:
            after.append(have)
        else:
            actions += _owned_update(have, want)
            after.append({**have, "spec": want["spec"]})
    for name, want in wanted.items():
        if name not in existing:
            actions.append(CreateClass(want))
            after.append(want)
    return actions, sorted(after, key=name_of), notes


def _owned_update(have: Obj, want: Obj) -> list[Action]:
    meta_have = have.get("metadata") or {}
    meta_patch = merge_diff(
        {k: {kk: (meta_have.get(k) or {}).get(kk) for kk in v} for k, v in
         want["metadata"].items() if isinstance(v, Mapping)},
        {k: v for k, v in want["metadata"].items() if isinstance(v, Mapping)})
    patch: Obj = {}
    if meta_patch:
        patch["metadata"] = meta_patch
    spec_patch = merge_diff(have.get("spec") or {}, want["spec"])
    if spec_patch:
        patch["spec"] = spec_patch
    return [PatchClass(name_of(have), patch, _rv(have))] if patch else []


def _rv(obj: Obj) -> str | None:
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    return str(rv) if rv else None


# -- 2. class status ---------------------------------------------------------------------------
def gpu_kinds(observed: Observed) -> list[tuple[Gpu, int]]:
    """One GPU per set of equal facts (what selectors read), with how many there are."""
    counts: Counter[tuple[object, ...]] = Counter()
    first: dict[tuple[object, ...], Gpu] = {}
    for placed in observed.gpus:
        g = placed.gpu
        facts = (g.model, g.memory_mib, g.index, g.labels)
        counts[facts] += 1
        first.setdefault(facts, g)
    return [(first[f], n) for f, n in counts.items()]


def class_status(obj: Obj, observed: Observed, now: str,
                 kinds: list[tuple[Gpu, int]] | None = None) -> Obj:
    """The desired ``status`` of one ResourceClass (``kinds``: ``gpu_kinds(observed)``)."""
    name = name_of(obj)
    parsed = class_of(obj, name)
    status: Obj = {}
    if isinstance(parsed, Broken):
        verdict = Verdict("Valid", False, parsed.reason, parsed.message)
    else:
        selected = sum(n for gpu, n in kinds or gpu_kinds(observed) if parsed.matches(gpu))
        status["gpus"] = selected
        verdict = Verdict("Valid", True, "SelectorValid", _selects(parsed, selected, observed))
    mine = [h for h in observed.holdings if h.gpu_class == name]
    status.update(_usage(mine))
    status.update(_unaccounted(observed, lambda pod: gpu_class_of(pod) == name))
    status["conditions"] = conditions([verdict], obj.get("status"), now, _generation(obj))
    return status


def _selects(cls: ResourceClass, selected: int, observed: Observed) -> str:
    if selected:
        return f"selects {selected} of {len(observed.gpus)} GPUs ({cls.selector.describe()})"
    models = ", ".join(sorted({g.gpu.model for g in observed.gpus})) or "none published"
    return (f"selects none of the {len(observed.gpus)} GPUs ({cls.selector.describe()}); "
            f"GPU labels are gpupool.io/model (models: {models}), gpupool.io/memory, "
            "gpupool.io/index and each GPUDevice's spec.labels")


def _usage(holdings: Sequence[PodHolding]) -> Obj:
    total = Amount()
    by_tenant: dict[str, Amount] = {}
    for h in holdings:
        amount = amount_of_allocation(h.allocation)
        total = total + amount
        by_tenant[h.tenant] = by_tenant.get(h.tenant, Amount()) + amount
    return {"pods": len(holdings), "allocated": amount_json(total),
            "allocatedByTenant": {t: amount_json(a) for t, a in sorted(by_tenant.items())}}


def _unaccounted(observed: Observed, names_it: Callable[[Obj], bool]) -> Obj:
    pods = [(pod, why) for pod, why in observed.unreadable_pods if names_it(pod)]
    if not pods:
        return {}
    listed = [why for _, why in pods[:MAX_LISTED]]
    more = len(pods) - len(listed)
    return {"unaccountedPods": listed + ([f"and {more} more"] if more else [])}


def _generation(obj: Obj) -> int | None:
    gen = (obj.get("metadata") or {}).get("generation")
    return gen if isinstance(gen, int) and not isinstance(gen, bool) else None


# -- 3. group status ---------------------------------------------------------------------------
def _charged_book(observed: Observed) -> QuotaBook:
    """Group limits and every live pod's charge, by the core's quota arithmetic."""
    book = QuotaBook()
    for obj in observed.groups:
        parsed = group_of(obj, name_of(obj))
        if not isinstance(parsed, Broken):
            book.set_group_limit(parsed[0].name, parsed[1])
    for h in observed.holdings:
        book.charge(h.key, Charge(amount_of_allocation(h.allocation), h.tenant, h.gpu_class,
                                  h.group))
    return book


def group_status(obj: Obj, observed: Observed, book: QuotaBook, now: str) -> Obj:
    """The desired ``status`` of one ResourceGroup."""
    name = name_of(obj)
    parsed = group_of(obj, name)
    status: Obj = {}
    verdicts: list[Verdict]
    if isinstance(parsed, Broken):
        verdicts = [Verdict("Valid", False, parsed.reason, parsed.message)]
    else:
        group, limit = parsed
        members = sum(1 for g in observed.gpus if group.holds(g.node, g.gpu))
        status["gpus"] = members
        used = book.used_by_group(name)
        verdicts = [Verdict("Valid", True, "SpecValid", _members(group, members)),
                    _quota_verdict(name, limit, used)]
        status["quota"] = _quota(limit, used)
    usage = _usage([h for h in observed.holdings if h.group == name])
    if "quota" in status:  # the same numbers are in quota.allocated
        del usage["allocated"]
    status.update(usage)
    status.update(_unaccounted(observed, lambda pod: _group_named(pod) == name))
    status["conditions"] = conditions(verdicts, obj.get("status"), now, _generation(obj))
    current = obj.get("status")
    if isinstance(current, Mapping):  # members, capacity, free, conflicts: ``groupsync``
        status.update({k: current[k] for k in PLANNED_KEYS if k in current})
    return status


def _members(group: ResourceGroup, members: int) -> str:
    who = ", ".join(sorted(group.tenants)) or "every tenant"
    if members:
        return f"{members} member GPUs, for {who}"
    return (f"no published GPU is a member: none of the {len(group.nodes)} nodes and "
            f"{len(group.gpus)} GPU uuids named has a GPUDevice"
            + (f" of model {', '.join(sorted(group.models))}" if group.models else "")
            + f"; pods of {who} in this group cannot be placed")


def _quota(limit: Limit | None, used: Amount) -> Obj:
    out: Obj = {"allocated": amount_json(used)}
    if limit is not None:
        out["limit"] = limit_json(limit)
        out["remaining"] = limit_json(limit.remaining(used))
    return out


_UNITS = (("gpus", "GPUs"), ("memory_mib", "MiB of GPU memory"), ("core_pct", "% of GPU compute"))


def _quota_verdict(name: str, limit: Limit | None, used: Amount) -> Verdict:
    if limit is None:
        return Verdict("WithinQuota", True, "NoLimit", f"group {name} has no quota; "
                       f"allocated {used.describe()}")
    over = [(unit, cap, getattr(used, dim)) for dim, unit in _UNITS
            if (cap := getattr(limit, dim)) is not None and getattr(used, dim) > cap]
    if not over:
        return Verdict("WithinQuota", True, "WithinLimit",
                       f"allocated {used.describe()}; limit {_describe_limit(limit)}")
    unit, cap, have = over[0]
    return Verdict("WithinQuota", False, "OverLimit",
                   f"allocated {have} {unit}, over the limit of {cap} (the limit was lowered "
                   f"below what runs): new pods of group {name} are refused until "
                   f"{have - cap} {unit} are freed or spec.quota is raised")


def _describe_limit(limit: Limit) -> str:
    parts = [f"{getattr(limit, dim)} {unit}" for dim, unit in _UNITS
             if getattr(limit, dim) is not None]
    return ", ".join(parts) or "none"


def _group_named(pod: Mapping[str, Any]) -> str | None:
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    return records.group_of(meta.get("annotations"), meta.get("labels"))
