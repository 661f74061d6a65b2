"""Quota for a gang as a whole: the sum of its members' charges against every limit.

A member alone may fit its tenant's quota while the gang does not; a gang's members are
placed together or not at all, so the gang is charged as one: the amounts of the members
to place are summed per (tenant, class) — checked against the tenant's limits
(``QuotaBook``) and the tenant quotas covering it (``TenantBook``, cohorts included) — and
per resource group. The first excess is the gang's one reason, prefixed with its name.
Pure arithmetic over the books (nothing is charged or noted as waiting).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpupool.core.eligibility import Catalogue
from gpupool.core.quota import Amount, Charge
from gpupool.core.reasons import Reason


def gang_charges(charges: Sequence[Charge]) -> list[Charge]:
    """``charges`` summed per (tenant, class) and per group, in first-seen order (a group's
    sum is a charge with only its group set)."""
    by_tenant: dict[tuple[str | None, str | None], Amount] = {}
    by_group: dict[str, Amount] = {}
    for c in charges:
        key = (c.tenant, c.gpu_class)
        by_tenant[key] = by_tenant.get(key, Amount()) + c.amount
        if c.group is not None:
            by_group[c.group] = by_group.get(c.group, Amount()) + c.amount
    return [Charge(a, t, k) for (t, k), a in by_tenant.items()] + \
        [Charge(a, group=g) for g, a in by_group.items()]


def gang_refusal(name: str, charges: Sequence[Charge], catalogue: Catalogue) -> Reason | None:
    """None when the members' ``charges`` together fit every limit; else the first excess."""
    for charge in gang_charges(charges):
        reason = catalogue.quotas.check(charge)
        if reason is None and charge.group is None:
            reason = catalogue.tenants.check(catalogue.quotas, charge)
        if reason is not None:
            return replace(reason, message=f"gang {name}: {reason.message}",
                           summary=f"gang {name}: {reason.common()}")
    return None
