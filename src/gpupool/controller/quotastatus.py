"""TenantQuota and GPUPermission status, from the pods gpupool placed.

A TenantQuota's ``status``: ``used`` (what its namespaces' pods hold: GPUs, MiB of GPU
memory, percent of compute), ``limit`` and ``remaining`` (limited dimensions only),
``borrowed`` (in a cohort: how far beyond its limits it runs on capacity its peers lend)
and ``borrowedPods`` (which of its pods run on that borrowed capacity: its youngest beyond
the nominal, the ones a lender's reclaim takes),
``usedByClass`` (per class it limits), in a cohort that shares fairly ``fairShare`` (its
fair share now: ``controller.fairstatus``), and the conditions ``Valid`` (the spec can be
read; a namespace also claimed by another quota is named), ``WithinQuota`` and, sharing
fairly, ``WithinFairShare``. The numbers are
those the extender enforces, by the same core arithmetic (``core.tenants``,
``core.cohort``). A GPUPermission's ``status``: ``Valid`` and ``gpus``, how many published
GPUs it permits.

Pure: ``plan`` takes the observed world and returns merge patches.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from gpupool.contract.nslabels import untrusted_keys, why_untrusted
from gpupool.contract.quotas import Broken, permission_of, quota_of
from gpupool.controller import fairstatus
from gpupool.controller.observed import Obj, Observed, PodHolding, name_of
from gpupool.controller.status import (
    MAX_LISTED,
    Verdict,
    amount_json,
    conditions,
    limit_json,
    merge_diff,
)
from gpupool.core.cohort import CohortState, borrowed_keys
from gpupool.core.model import Labels, Node
from gpupool.core.quota import Amount, Charge, QuotaBook, amount_of_allocation
from gpupool.core.tenants import TenantBook, TenantQuota
from gpupool.core.tenantshare import Entitlement, WaitingAsks
from gpupool.core.victims import Candidate


@dataclass(frozen=True, slots=True)
class StatusPatch:
    kind: str  # "TenantQuota" or "GPUPermission"
    name: str
    patch: Obj


def charged(observed: Observed) -> QuotaBook:
    book = QuotaBook()
    for h in observed.holdings:
        book.charge(h.key, Charge(amount_of_allocation(h.allocation), h.tenant, h.gpu_class,
                                  h.group))
    return book


@dataclass(frozen=True, slots=True)
class Read:
    """The TenantQuotas of one round, read once: the objects by name, each resolved
    against the namespaces as they are, their book, and what the cluster holds."""

    objs: list[Obj]
    parsed: dict[str, TenantQuota | Broken]
    tenants: TenantBook
    book: QuotaBook


def read(observed: Observed, quotas: Iterable[Obj],
         namespaces: Mapping[str, Labels] | None = None) -> Read:
    objs = sorted(quotas, key=name_of)
    parsed = {name_of(o): resolved(o, namespaces or {}) for o in objs}
    tenants = TenantBook(q for q in parsed.values() if not isinstance(q, Broken))
    return Read(objs, parsed, tenants, charged(observed))


def plan(observed: Observed, quotas: Iterable[Obj], permissions: Iterable[Obj],
         nodes: list[Node], now: str, namespaces: Mapping[str, Labels] | None = None,
         fair: Mapping[str, Entitlement] | None = None, done: Read | None = None
         ) -> list[StatusPatch]:
    """Status patches for every TenantQuota and GPUPermission that needs one
    (``namespaces``: every namespace's labels, for namespace selectors; ``fair``: the fair
    shares, ``fair_shares``; None: worked out with no pod waiting; ``done``: the quotas
    as ``read`` them this round, else read here)."""
    r = done or read(observed, quotas, namespaces)
    if fair is None:
        fair = fairstatus.shares(r.tenants, r.book, WaitingAsks())
    out = []
    for obj in r.objs:
        desired = quota_status(obj, r.parsed[name_of(obj)], r.tenants, r.book, now,
                               observed.holdings, namespaces, fair)
        out += _patch("TenantQuota", obj, desired)
    for obj in sorted(permissions, key=name_of):
        out += _patch("GPUPermission", obj, permission_status(obj, nodes, now))
    return out


def fair_shares(observed: Observed, quotas: Iterable[Obj], pods: Iterable[Obj],
                namespaces: Mapping[str, Labels] | None = None, done: Read | None = None
                ) -> dict[str, Entitlement]:
    """The fair share of every tenant of a cohort that shares fairly, by tenant name, over
    what the tenants hold and what their waiting ``pods`` ask (``controller.fairstatus``)."""
    r = done or read(observed, quotas, namespaces)
    if not any(r.tenants.shares_fairly(q.cohort) for q in r.tenants):
        return {}
    return fairstatus.shares(r.tenants, r.book, fairstatus.waiting_asks(observed, pods))


def _patch(kind: str, obj: Obj, desired: Obj) -> list[StatusPatch]:
    patch = merge_diff(obj.get("status") or {}, desired)
    return [StatusPatch(kind, name_of(obj), patch)] if patch else []


def resolved(obj: Obj, namespaces: Mapping[str, Labels]) -> TenantQuota | Broken:
    """The quota with its namespaces as they are now: those ``spec.namespaces`` names, and
    those whose labels ``spec.namespaceSelector`` matches (not the last status's). A
    selector that reads a label a tenant can write selects nothing (``contract.nslabels``;
    the quota's ``Valid`` condition says so)."""
    parsed = quota_of({**obj, "status": {}})
    found = _selected(parsed, namespaces) if not isinstance(parsed, Broken) else None
    if isinstance(parsed, Broken) or not found:
        return parsed
    return replace(parsed, namespaces=parsed.namespaces | frozenset(found))


def _selected(q: TenantQuota, namespaces: Mapping[str, Labels] | None) -> list[str] | None:
    if q.namespace_selector is None:
        return None
    sel = q.namespace_selector
    if untrusted_keys(sel):
        return []
    return sorted(ns for ns, labels in (namespaces or {}).items() if sel.matches(dict(labels)))


def quota_status(obj: Obj, parsed: TenantQuota | Broken, tenants: TenantBook,
                 book: QuotaBook, now: str, holdings: Sequence[PodHolding] = (),
                 namespaces: Mapping[str, Labels] | None = None,
                 fair: Mapping[str, Entitlement] | None = None) -> Obj:
    status: Obj = {}
    if isinstance(parsed, Broken):
        verdicts = [Verdict("Valid", False, parsed.reason, parsed.message)]
    else:
        used = tenants.used(book, parsed)
        status = {"namespaces": sorted(parsed.namespaces), "used": amount_json(used),
                  "selectedNamespaces": _selected(parsed, namespaces),
                  "limit": limit_json(parsed.limit),
                  "remaining": limit_json(parsed.limit.remaining(used))}
        if status["selectedNamespaces"] is None:
            del status["selectedNamespaces"]
        if parsed.cohort is not None:
            cohort = tenants.cohort(book, parsed)
            status["borrowed"] = amount_json(cohort.borrowed(f"tenant {parsed.name}"))
            status["borrowedPods"] = borrowed_pods(parsed, cohort, holdings)
        if parsed.classes:
            status["usedByClass"] = {c: amount_json(tenants.used(book, parsed, c))
                                     for c, _ in parsed.classes}
        verdicts = [_valid(parsed, tenants.overlaps()), _within(parsed, used)]
        share = (fair or {}).get(parsed.name)
        if share is not None:
            status["fairShare"] = fairstatus.status_json(parsed, share)
            verdicts.append(fairstatus.condition(parsed, share))
    status["conditions"] = conditions(verdicts, _map(obj.get("status")), now,
                                      _generation(obj))
    return status


def borrowed_pods(q: TenantQuota, cohort: CohortState, holdings: Sequence[PodHolding]
                  ) -> list[str]:
    """The tenant's pods that run on borrowed capacity, as ``core.cohort.borrowed_keys``
    tells them (its youngest pods beyond its nominal; reclaim takes these), by name: at
    most ``MAX_LISTED``, then a count of the rest."""
    mine = [h for h in holdings if h.tenant in q.namespaces]
    pods = [Candidate(h.allocation, h.priority, Charge(amount_of_allocation(h.allocation),
                                                       h.tenant), started_s=h.bound_s)
            for h in mine]
    keys = borrowed_keys(cohort, pods, lambda c: f"tenant {q.name}")
    names = sorted(h.pod for h in mine if h.key in keys)
    listed = names[:MAX_LISTED]
    return listed + ([f"and {len(names) - len(listed)} more"] if len(names) > len(listed)
                     else [])


def _valid(q: TenantQuota, overlaps: Mapping[str, tuple[str, ...]]) -> Verdict:
    keys = untrusted_keys(q.namespace_selector) if q.namespace_selector else []
    if keys:
        return Verdict("Valid", False, "UntrustedSelector", f"{why_untrusted(keys)}: it "
                       f"selects no namespace until fixed; the namespaces named in "
                       f"spec.namespaces ({', '.join(sorted(q.namespaces)) or 'none'}) "
                       f"are limited")
    shared = {ns: names for ns, names in overlaps.items() if ns in q.namespaces}
    if not shared:
        return Verdict("Valid", True, "SpecValid", f"tenant {q.name}: namespaces "
                       f"{', '.join(sorted(q.namespaces)) or '(none)'}")
    words = "; ".join(f"{ns} also in {', '.join(n for n in names if n != q.name)}"
                      for ns, names in shared.items())
    return Verdict("Valid", True, "NamespaceShared", f"every quota naming a namespace "
                   f"applies to its pods: {words}")


def _within(q: TenantQuota, used: Amount) -> Verdict:
    over = [(dim, cap, getattr(used, dim)) for dim in ("gpus", "memory_mib", "core_pct")
            if (cap := getattr(q.limit, dim)) is not None and getattr(used, dim) > cap]
    if not over:
        return Verdict("WithinQuota", True, "WithinLimit", f"uses {_words(used)}")
    dim, cap, have = over[0]
    reason = "Borrowing" if q.cohort is not None else "OverLimit"
    return Verdict("WithinQuota", False, reason,
                   f"uses {have} of {dim} over its limit of {cap}"
                   + (f", borrowed from cohort {q.cohort}" if q.cohort else
                      " (the limit was lowered below what runs): new pods wait until "
                      "enough is freed or the limit is raised"))


def _words(a: Amount) -> str:
    return f"{a.gpus} GPUs, {a.memory_mib} MiB of GPU memory, {a.core_pct} percent of compute"


def permission_status(obj: Obj, nodes: list[Node], now: str) -> Obj:
    parsed = permission_of(obj)
    if isinstance(parsed, Broken):
        verdict = Verdict("Valid", False, parsed.reason, parsed.message)
        return {"gpus": 0, "conditions": conditions([verdict], _map(obj.get("status")), now,
                                                     _generation(obj))}
    count = sum(1 for n in nodes for g in n.gpus if parsed.permits(n, g))
    verdict = Verdict("Valid", True, "SpecValid", f"permits {count} GPUs to "
                      f"{', '.join(sorted(parsed.tenants))}")
    return {"gpus": count, "conditions": conditions([verdict], _map(obj.get("status")), now,
                                                     _generation(obj))}


def _map(value: object) -> Mapping[str, object] | None:
    return value if isinstance(value, Mapping) else None


def _generation(obj: Obj) -> int | None:
    gen = (obj.get("metadata") or {}).get("generation")
    return gen if isinstance(gen, int) and not isinstance(gen, bool) else None
