"""Where may a request go at all? Classes, groups and quota turned into ``Constraints``.

``constraints_for`` is the one function adapters call before fit and scoring:

1. class and selector: ``request.gpu_class`` (an unknown class blocks the pod)
   and ``request.selector`` become a GPU mask; the tenant's GPU permissions
   (``tenants.PermissionBook``) narrow it (none left blocks the pod, naming them);
2. quota of the tenant and of (tenant, class), and of every tenant quota covering
   the pod's namespace (``tenants.TenantBook``): exceeded blocks the pod with
   the quota ``Reason`` and its numbers;
3. group: ``request.group`` names one (unknown, not allowed for the tenant, or
   meant for other GPU models blocks the pod); when it names none and groups
   exist, one is chosen by best fit among the tenant's groups; a tenant with no
   group is blocked. Without groups, or for a pod without GPUs that names no
   group, the whole cluster is eligible.

It is pure and cheap: class and group masks are cached per cluster epoch, the
rest is a few vectorised passes per candidate group. The chosen group is in
``Constraints.group``; charge the allocation with ``charge_of`` once reserved.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from gpupool.core.allocation import Allocation
from gpupool.core.classes import ClassCatalog
from gpupool.core.fit import Constraints, demand_of, kind_mask
from gpupool.core.groups import GroupCatalog
from gpupool.core.quota import Amount, Charge, QuotaBook, amount_of_allocation, amount_of_request
from gpupool.core.reasons import Check, Reason
from gpupool.core.request import PodRequest
from gpupool.core.state import BoolArray, ClusterState
from gpupool.core.tenants import PermissionBook, TenantBook


@dataclass(slots=True)
class Catalogue:
    """What an adapter keeps besides the cluster state: groups, classes and quotas."""

    groups: GroupCatalog = field(default_factory=GroupCatalog)
    classes: ClassCatalog = field(default_factory=ClassCatalog)
    quotas: QuotaBook = field(default_factory=QuotaBook)
    tenants: TenantBook = field(default_factory=TenantBook)  # tenant quotas (TenantQuota)
    permissions: PermissionBook = field(default_factory=PermissionBook)  # GPUPermission


def constraints_for(state: ClusterState, request: PodRequest, catalogue: Catalogue
                    ) -> Constraints:
    """The masks (or the refusal) that classes, groups and quota put on ``request``."""
    found = _constraints(state, request, catalogue)
    if found.blocked is None and len(catalogue.permissions) and request.gpus:
        names = catalogue.permissions.names_of(request.tenant)
        if names:
            return replace(found, permission=f"GPUPermission {names}")
    return found


def _constraints(state: ClusterState, request: PodRequest, catalogue: Catalogue
                 ) -> Constraints:
    gpu_mask, blocked = class_mask(state, request, catalogue.classes)
    if blocked is not None:
        return Constraints(blocked=blocked)
    gpu_mask, blocked = _permitted(state, request, catalogue, gpu_mask)
    if blocked is not None:
        return Constraints(blocked=blocked)
    charge = Charge(request_amount(state, request, gpu_mask), request.tenant, request.gpu_class)
    blocked = catalogue.quotas.check(charge) or catalogue.tenants.check(catalogue.quotas, charge,
                                                                         request.key)
    if blocked is not None:
        return Constraints(blocked=blocked)
    if request.group is not None:
        return _named_group(state, request, catalogue, gpu_mask, charge)
    if len(catalogue.groups) == 0 or not request.gpus:
        return Constraints(gpu_mask=gpu_mask)
    return _best_fit_group(state, request, catalogue, gpu_mask, charge)


def class_mask(state: ClusterState, request: PodRequest, classes: ClassCatalog
               ) -> tuple[BoolArray | None, Reason | None]:
    """GPUs of the request's class and selector (None: no restriction), or why not."""
    if request.gpu_class is not None and request.gpu_class not in classes:
        known = ", ".join(classes.names()) or "none"
        return None, _blocked(Check.CLASS, f"resource class {request.gpu_class} does not "
                              f"exist (known: {known})", True)
    return classes.request_mask(state, request.gpu_class, request.selector), None


def request_amount(state: ClusterState, request: PodRequest, gpu_mask: BoolArray | None
                   ) -> Amount:
    """The quota amount of ``request``; exclusive GPUs count the smallest eligible GPU."""
    demand = demand_of(request)
    whole = 0
    if demand is not None and demand.exclusive:
        eligible = state.present if gpu_mask is None else state.present & gpu_mask
        kind = kind_mask(state, demand)
        eligible = eligible if kind is None else eligible & kind
        units = state.unit_cap[eligible]
        whole = int(units.min()) * state.memory_unit_mib if units.size else 0
    return amount_of_request(request, state.memory_unit_mib, whole)


def charge_of(request: PodRequest, alloc: Allocation, constraints: Constraints) -> Charge:
    """What to charge once ``alloc`` (placed under ``constraints``) is reserved."""
    return Charge(amount_of_allocation(alloc), request.tenant, request.gpu_class,
                  constraints.group)


def _named_group(state: ClusterState, request: PodRequest, catalogue: Catalogue,
                 gpu_mask: BoolArray | None, charge: Charge) -> Constraints:
    name = request.group
    assert name is not None
    if name not in catalogue.groups:
        known = ", ".join(g.name for g in catalogue.groups) or "none"
        return Constraints(blocked=_blocked(
            Check.GROUP, f"resource group {name} does not exist (known: {known})", True))
    group = catalogue.groups.get(name)
    if not group.allows(request.tenant):
        who = ", ".join(sorted(group.tenants))
        return Constraints(blocked=_blocked(
            Check.GROUP, f"tenant {request.tenant or '(none)'} may not use group {name} "
            f"(it is for {who})", True))
    if not group.suits(request.models):
        return Constraints(blocked=_blocked(
            Check.GROUP, f"group {name} is meant for {', '.join(sorted(group.models))}, the pod "
            f"allows {', '.join(sorted(request.models or ()))}", True))
    reason = catalogue.quotas.check(Charge(charge.amount, group=name)) or \
        _outside_permissions(state, request, catalogue, name)
    if reason is not None:
        return Constraints(blocked=reason)
    return catalogue.groups.constraints(state, name, gpu_mask)


def _outside_permissions(state: ClusterState, request: PodRequest, catalogue: Catalogue,
                         name: str) -> Reason | None:
    if len(catalogue.permissions) == 0:
        return None
    return catalogue.permissions.refusal(state, request.tenant,
                                         catalogue.groups.gpu_mask(state, name),
                                         f"GPU of group {name}")


def _best_fit_group(state: ClusterState, request: PodRequest, catalogue: Catalogue,
                    gpu_mask: BoolArray | None, charge: Charge) -> Constraints:
    groups = catalogue.groups
    if not groups.usable_by(request.tenant):
        names = ", ".join(g.name for g in groups)
        return Constraints(blocked=_blocked(
            Check.GROUP, f"tenant {request.tenant or '(none)'} may use no resource group "
            f"(groups: {names})", True))
    choice = groups.choose(state, request, gpu_mask, catalogue.quotas, charge)
    if choice.group is None:
        why = "; ".join(choice.refusals())
        return Constraints(blocked=_blocked(
            Check.GROUP, f"no resource group of tenant {request.tenant or '(none)'} can hold "
            f"{request.describe()}: {why}", all(r.permanent for r in choice.rooms)))
    return groups.constraints(state, choice.group.name, gpu_mask)


def _permitted(state: ClusterState, request: PodRequest, catalogue: Catalogue,
               gpu_mask: BoolArray | None) -> tuple[BoolArray | None, Reason | None]:
    """``gpu_mask`` within the tenant's GPU permissions, or why it leaves no GPU."""
    if len(catalogue.permissions) == 0 or not request.gpus:
        return gpu_mask, None
    what = f"GPU of class {request.gpu_class}" if request.gpu_class else "GPU"
    reason = catalogue.permissions.refusal(state, request.tenant, gpu_mask, what)
    if reason is not None:
        return None, reason
    return catalogue.permissions.narrowed(state, request.tenant, gpu_mask), None


def _blocked(check: Check, message: str, permanent: bool) -> Reason:
    """A request-level refusal (``Reason.node`` is empty: it applies to every node)."""
    return Reason("", check, message, permanent)

