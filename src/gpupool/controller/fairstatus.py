"""The fair share of each member of a cohort that shares fairly, for TenantQuota status and
the controller's metrics.

The division is the extender's (``core.tenantshare.entitlements``: ``wants``, then
``core.cohort.fair_shares``) over what the members hold and what their waiting pods ask.
*Waiting pods* here are every pending, unbound GPU pod of a member's namespaces that is not
held back by a scheduling gate; each asks what the extender would charge it
(``core.eligibility.request_amount``). The extender counts only the pods it has filtered, so
its view fills in to this one as kube-scheduler retries every pending pod.

Status (``status.fairShare``, limited dimensions only): ``weight``, ``wanted`` (what it would
borrow holding what it holds plus what waits), ``share`` (its fair share of what the cohort
lends: the figure a fair-share refusal names), ``entitled`` (limits + share: what it may hold
while the others want more), ``usedPercent`` (used over entitled, rounded up; absent where
it is entitled to none and holds some) and ``dominantPercent``/``dominantResource`` (the
largest); the condition ``WithinFairShare`` (False: it borrows beyond its share, and its
borrowed pods may be reclaimed for a member within its own). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from math import ceil, isinf
from typing import Any

from gpupool.contract.podspec_request import pod_request
from gpupool.controller.figures import cluster_state, pending_reason
from gpupool.controller.observed import Observed
from gpupool.controller.status import Verdict
from gpupool.core.cohort import DIMS
from gpupool.core.eligibility import request_amount
from gpupool.core.errors import InvalidInput
from gpupool.core.quota import Amount, QuotaBook
from gpupool.core.tenants import TenantBook, TenantQuota
from gpupool.core.tenantshare import Entitlement, WaitingAsks, entitlements

JSON_DIMS = {"gpus": "gpus", "memory_mib": "memoryMiB", "core_pct": "corePct"}
METRIC_DIMS = {"gpus": "gpus", "memory_mib": "memory_mib", "core_pct": "core_pct"}
NOT_WAITING = ("gated", "allocation-failed")  # pending reasons of pods no filter counts


@dataclass(frozen=True, slots=True)
class FairShareFigure:
    """One tenant's fair share, for the metrics."""

    tenant: str
    cohort: str
    entitlement: Entitlement


def waiting_asks(observed: Observed, pods: Iterable[Mapping[str, Any]]) -> WaitingAsks:
    """What every waiting GPU pod asks, by pod (see the module); a pod whose request
    cannot be read asks nothing here (the extender refuses it)."""
    out = WaitingAsks()
    state = None
    for pod in pods:
        reason = pending_reason(pod)
        if reason is None or reason in NOT_WAITING:
            continue
        try:
            request = pod_request(pod)
        except InvalidInput:
            continue
        state = state if state is not None else cluster_state(observed)
        out.note(request.key, request.tenant, request_amount(state, request, None))
    return out


def shares(tenants: TenantBook, book: QuotaBook, waiting: WaitingAsks
           ) -> dict[str, Entitlement]:
    """Every tenant of a cohort that shares fairly: its entitlement, by tenant name."""
    tenants.waiting = waiting
    out: dict[str, Entitlement] = {}
    done: set[str] = set()
    for q in tenants:
        if q.cohort is None or q.cohort in done or not tenants.shares_fairly(q.cohort):
            continue
        done.add(q.cohort)
        state = tenants.cohort(book, q)
        found = entitlements(state, q.cohort, tenants.waiting_by_member(book, q.cohort))
        out.update({name.removeprefix("tenant "): e for name, e in found.items()})
    return out


def figures(found: Mapping[str, Entitlement]) -> tuple[FairShareFigure, ...]:
    return tuple(FairShareFigure(t, e.cohort, e) for t, e in sorted(found.items()))


def status_json(q: TenantQuota, e: Entitlement) -> dict[str, Any]:
    """``status.fairShare`` of ``q`` (see the module)."""
    counted = [d for d in DIMS if getattr(q.limit, d) is not None]
    percent = {JSON_DIMS[d]: ceil(100 * r - 1e-9) for d in counted
               if (r := e.ratio(d)) is not None and not isinf(r)}
    out: dict[str, Any] = {
        "weight": q.weight,
        "wanted": {JSON_DIMS[d]: getattr(e.wanted, d) for d in counted},
        "share": {JSON_DIMS[d]: getattr(e.share, d) for d in counted},
        "entitled": {JSON_DIMS[d]: getattr(e.entitled, d) for d in counted},
        "usedPercent": percent,
    }
    top = e.dominant
    if top is not None and not isinf(top[1]):
        out["dominantResource"] = JSON_DIMS[top[0]]
        out["dominantPercent"] = percent[JSON_DIMS[top[0]]]
    return out


def condition(q: TenantQuota, e: Entitlement) -> Verdict:
    """``WithinFairShare``: does the tenant borrow beyond its fair share?"""
    if not e.beyond:
        return Verdict("WithinFairShare", True, "WithinFairShare",
                       f"borrows {_words(e.borrowed, e.share)} of cohort {q.cohort}")
    d = e.beyond[0]
    return Verdict("WithinFairShare", False, "BeyondFairShare",
                   f"borrows {getattr(e.borrowed, d)} {_UNITS[d]} of cohort {q.cohort}, its "
                   f"fair share is {getattr(e.share, d)} (weight {q.weight}): its borrowed "
                   f"pods may be reclaimed for a member within its share")


_UNITS = {"gpus": "GPUs", "memory_mib": "MiB of GPU memory", "core_pct": "percent of compute"}


def _words(borrowed: Amount, share: Amount) -> str:
    parts = [f"{getattr(borrowed, d)} of {getattr(share, d)} {_UNITS[d]}" for d in DIMS
             if getattr(share, d) or getattr(borrowed, d)]
    return ", ".join(parts) or "nothing"
