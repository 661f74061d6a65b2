"""A simulated tenant's own limits: its tenant quota, its quotas per class and its GPU
permissions — the running system's ``core.tenants`` objects, the tenant as its one
namespace (docs/tenancy.md, "Tenants in the simulator").

``TenantLimits`` keeps the charges of running pods in a ``core.quota.QuotaBook`` and asks
``core.tenants.TenantBook.check`` — the extender's check, with its reasons — before a pod
starts. ``PermittedDecider`` places through ``core.eligibility.constraints_for`` with the
tenants' ``PermissionBook``, as the extender filters. Both note, per tenant, the pods that
waited because of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpupool.core.allocation import Allocation
from gpupool.core.eligibility import Catalogue, constraints_for
from gpupool.core.fit import Constraints
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.quota import Amount, Charge, QuotaBook
from gpupool.core.request import PodRequest
from gpupool.core.state import ClusterState
from gpupool.core.tenants import Permission, PermissionBook, TenantBook, TenantQuota
from gpupool.sim.decision import Decider
from gpupool.sim.scenario import Scenario


@dataclass(slots=True)
class TenantTally:
    """What one tenant met of its own limits: pods that waited at least once because of
    its permissions, its tenant quota or its quota for a class; the first reason given."""

    pods: int = 0
    permission: set[str] = field(default_factory=set)
    tenant_quota: set[str] = field(default_factory=set)
    class_quota: set[str] = field(default_factory=set)
    reason: str = ""
    nodes: set[str] = field(default_factory=set)  # nodes its pods ran on
    nominal_gpus: int | None = None  # its tenant quota's GPUs (None: not limited)
    class_gpus: dict[str, int | None] = field(default_factory=dict)  # per class quota


class PermittedDecider(Decider):
    """The policy's decisions within the tenants' GPU permissions, through the same
    ``constraints_for`` as the extender (class and selector, then permissions)."""

    def __init__(self, state: ClusterState, policy: str, config: PolicyConfig, seed: int,
                 scenario: Scenario, permissions: PermissionBook):
        super().__init__(state, policy, config, seed, scenario.classes)
        self.catalogue = Catalogue(classes=self.catalog, permissions=permissions)

    def constraints(self, request: PodRequest) -> Constraints:
        if len(self.catalogue.permissions) == 0 or not request.gpus:
            return super().constraints(request)
        return constraints_for(self.state, request, self.catalogue)

    def restricted(self, tenant: str | None) -> bool:
        return bool(self.catalogue.permissions.of(tenant))

    def fits_elsewhere(self, request: PodRequest) -> bool:
        """Whether some node would take ``request`` now were its tenant not restricted."""
        found = self.placer.candidates(self.state, request, super().constraints(request), None)
        return bool(found.indices.size)


class TenantLimits:
    """Tenant quotas and permissions of one replay, and what they held back."""

    def __init__(self, quotas: Sequence[TenantQuota], permissions: Sequence[Permission]):
        self.book, self.quotas = QuotaBook(), TenantBook(quotas)
        limited = [q.name for q in quotas] + sorted({t for p in permissions for t in p.tenants})
        self.tallies = {t: TenantTally() for t in dict.fromkeys(limited)}
        for q in quotas:
            self.tallies[q.name].nominal_gpus = q.limit.gpus
            self.tallies[q.name].class_gpus = {c: lim.gpus for c, lim in q.classes}
        self.noted: set[str] | None = None  # where the last refusal was noted
        self.curve_tenant: dict[str, list[int]] = {q.name: [] for q in quotas}
        self.curve_class: dict[tuple[str, str], list[int]] = {
            (q.name, c): [] for q in quotas for c, _ in q.classes}

    def arrived(self, tenant: str | None) -> None:
        if tenant in self.tallies:
            self.tallies[tenant].pods += 1

    def admits(self, key: str, request: PodRequest, amount: Amount) -> bool:
        """Whether ``request``'s tenant quotas admit ``amount`` more (else noted)."""
        tenant = request.tenant
        if len(self.quotas) == 0 or tenant is None:
            return True
        reason = self.quotas.check(self.book, Charge(amount, tenant, request.gpu_class))
        if reason is None:
            return True
        quota = self.quotas.by_name[tenant]
        used = TenantBook.used(self.book, quota)
        tally = self.tallies[tenant]
        own = any(True for _ in quota.limit.exceeded(used, amount))
        self.noted = tally.tenant_quota if own else tally.class_quota
        self.noted.add(key)
        tally.reason = tally.reason or reason.message
        return False

    def kept_out(self, key: str, request: PodRequest, decider: PermittedDecider) -> None:
        """Note ``request`` (found no room) if its permissions kept it from room elsewhere."""
        tenant = request.tenant
        if not decider.restricted(tenant) or not decider.fits_elsewhere(request):
            return
        assert tenant is not None
        tally = self.tallies[tenant]
        tally.permission.add(key)
        self.noted = tally.permission
        if not tally.reason:
            names = decider.catalogue.permissions.names_of(tenant)
            tally.reason = f"no room on the GPUs of GPUPermission {names}"

    def behind(self, keys: Sequence[str]) -> None:
        """Note ``keys`` (pods queued behind the one just refused, alike in tenant, class
        and size, not tried in this pass) for the same reason; forget the refusal."""
        if self.noted is not None:
            self.noted.update(keys)
        self.noted = None

    def charge(self, key: str, request: PodRequest, allocation: Allocation, amount: Amount,
               group: str | None) -> None:
        self.book.charge(key, Charge(amount, request.tenant, request.gpu_class, group))
        if request.tenant in self.tallies:
            self.tallies[request.tenant].nodes.add(allocation.node)

    def refund(self, key: str) -> None:
        self.book.refund(key)

    def record(self) -> None:
        for t, curve in self.curve_tenant.items():
            curve.append(self.book.used_by_tenant(t).gpus)
        for (t, c), curve in self.curve_class.items():
            curve.append(self.book.used_by_class(t, c).gpus)

    def curves(self) -> tuple[dict[str, tuple[int, ...]], dict[tuple[str, str], tuple[int, ...]]]:
        return ({t: tuple(v) for t, v in self.curve_tenant.items()},
                {k: tuple(v) for k, v in self.curve_class.items()})
