"""Quota arithmetic (tenant groups and resource classes): limits, what is charged, what remains.

Three scopes carry limits: a tenant (a tenant's upper limit), a
(tenant, class) pair (per-namespace quota per resource class) and a
resource group. Each limit has three dimensions, each optional (None =
unlimited):

* ``gpus`` — GPUs touched: every distinct GPU an allocation holds counts 1,
  whether whole or a slice. This is what ``gpupool.io/gpu`` and
  ``class.gpupool.io/<class>`` count, so it agrees with native ResourceQuota.
* ``memory_mib`` — GPU memory: the slice's memory (rounded to memory units),
  or the whole GPU's memory for an exclusive GPU.
* ``core_pct`` — compute in percent of one GPU: the slice's share, 100 per
  exclusive GPU.

``remaining = limit − charged``. Charges are keyed by allocation key (the pod
UID), so charging twice or refunding twice changes nothing. The book is plain
arithmetic: it never looks at the cluster, and it refuses with a ``Reason``
(check ``QUOTA``) that names the scope, the dimension and the numbers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import TypeVar

from gpupool.core.allocation import Allocation
from gpupool.core.errors import InvalidInput
from gpupool.core.model import CORE_UNITS_PER_GPU
from gpupool.core.reasons import Check, Reason
from gpupool.core.request import PodRequest, merged_demand

K = TypeVar("K")
_UNITS = {"gpus": "GPUs", "memory_mib": "MiB of GPU memory", "core_pct": "% of GPU compute"}


@dataclass(frozen=True, slots=True)
class Amount:
    """A quantity of GPU resources in the three quota dimensions."""

    gpus: int = 0
    memory_mib: int = 0
    core_pct: int = 0

    def __post_init__(self) -> None:
        if self.gpus < 0 or self.memory_mib < 0 or self.core_pct < 0:
            raise InvalidInput(f"a quota amount cannot be negative: {self.describe()}")

    def __add__(self, other: Amount) -> Amount:
        return Amount(self.gpus + other.gpus, self.memory_mib + other.memory_mib,
                      self.core_pct + other.core_pct)

    def minus(self, other: Amount) -> Amount:
        """``self - other``; it is a bug to take away more than there is."""
        return Amount(self.gpus - other.gpus, self.memory_mib - other.memory_mib,
                      self.core_pct - other.core_pct)

    def describe(self) -> str:
        return f"{self.gpus} GPUs, {self.memory_mib} MiB, {self.core_pct} % compute"


@dataclass(frozen=True, slots=True)
class Limit:
    """An upper limit per dimension; None means that dimension is not limited."""

    gpus: int | None = None
    memory_mib: int | None = None
    core_pct: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and value < 0:
                raise InvalidInput(f"quota limit {f.name} must be >= 0, got {value}")

    def exceeded(self, used: Amount, more: Amount) -> Iterator[tuple[str, int, int, int]]:
        """(dimension, limit, used, asked) for each dimension ``used + more`` exceeds."""
        for f in fields(self):
            cap = getattr(self, f.name)
            if cap is None:
                continue
            u, m = getattr(used, f.name), getattr(more, f.name)
            if m > 0 and u + m > cap:
                yield f.name, cap, u, m

    def remaining(self, used: Amount) -> Limit:
        """``limit − used`` per dimension (never below 0; None stays unlimited)."""
        def left(cap: int | None, u: int) -> int | None:
            return None if cap is None else max(cap - u, 0)
        return Limit(left(self.gpus, used.gpus), left(self.memory_mib, used.memory_mib),
                     left(self.core_pct, used.core_pct))


@dataclass(frozen=True, slots=True)
class Charge:
    """What one allocation counts against: its tenant, its class, its group."""

    amount: Amount
    tenant: str | None = None
    gpu_class: str | None = None
    group: str | None = None


def amount_of_allocation(alloc: Allocation) -> Amount:
    """What ``alloc`` holds: distinct GPUs, their memory and compute (slices summed)."""
    memory = sum(s.memory_mib for s in alloc.slices)
    core = sum(s.core_pct for s in alloc.slices)
    return Amount(len(alloc.gpu_uuids), memory, core)


def amount_of_request(request: PodRequest, memory_unit_mib: int, whole_gpu_mib: int) -> Amount:
    """What ``request`` will hold once placed, before it is placed.

    Shared memory is rounded up to ``memory_unit_mib`` as the state accounts it.
    Exclusive GPUs count ``whole_gpu_mib`` each: the caller passes the memory of
    the smallest GPU the pod may get, so this is a lower bound for them (the
    exact amount is ``amount_of_allocation`` of the chosen allocation).
    """
    if not request.gpus:
        return Amount()
    d = merged_demand(request)
    if d.exclusive:
        return Amount(d.count, d.count * whole_gpu_mib, d.count * CORE_UNITS_PER_GPU)
    units = -(-d.memory_mib // memory_unit_mib)
    return Amount(d.count, d.count * units * memory_unit_mib, d.count * d.core_pct)


class QuotaBook:
    """Limits per scope and the charges of live allocations (keyed, idempotent)."""

    def __init__(self) -> None:
        self.tenant_limits: dict[str, Limit] = {}
        self.class_limits: dict[tuple[str, str], Limit] = {}
        self.group_limits: dict[str, Limit] = {}
        self._charges: dict[str, Charge] = {}
        self._used: dict[tuple[str, ...], Amount] = {}
        self.version = 0  # grows with every charge and refund (a cache key for sums of usage)

    # -- limits ------------------------------------------------------------------
    def set_tenant_limit(self, tenant: str, limit: Limit | None) -> None:
        """Set (or with None, lift) a tenant's limit."""
        _set(self.tenant_limits, tenant, limit)

    def set_class_limit(self, tenant: str, gpu_class: str, limit: Limit | None) -> None:
        _set(self.class_limits, (tenant, gpu_class), limit)

    def set_group_limit(self, group: str, limit: Limit | None) -> None:
        _set(self.group_limits, group, limit)

    # -- charges -----------------------------------------------------------------
    def charge(self, key: str, charge: Charge) -> None:
        """Count ``charge`` under allocation ``key``. Charging the same value twice is a
        no-op; a different value under a held key is ``InvalidInput`` (refund first).
        Charging never refuses: call ``check`` first (quota is advisory for pods that
        already run, e.g. when the state is rebuilt after a restart)."""
        held = self._charges.get(key)
        if held is not None:
            if held == charge:
                return
            raise InvalidInput(f"{key} is already charged {held.amount.describe()}")
        self._charges[key] = charge
        self.version += 1
        for scope in _scopes(charge):
            self._used[scope] = self._used.get(scope, Amount()) + charge.amount

    def refund(self, key: str) -> Charge | None:
        """Give back what ``key`` was charged; refunding twice is harmless."""
        charge = self._charges.pop(key, None)
        if charge is None:
            return None
        self.version += 1
        for scope in _scopes(charge):
            left = self._used.get(scope, Amount()).minus(charge.amount)  # absent = zero
            if left == Amount():
                self._used.pop(scope, None)
            else:
                self._used[scope] = left
        return charge

    def charged(self, key: str) -> Charge | None:
        return self._charges.get(key)

    def __len__(self) -> int:
        return len(self._charges)

    # -- reading -----------------------------------------------------------------
    def used_by_tenant(self, tenant: str) -> Amount:
        return self._used.get(("tenant", tenant), Amount())

    def used_by_class(self, tenant: str, gpu_class: str) -> Amount:
        return self._used.get(("class", tenant, gpu_class), Amount())

    def used_by_group(self, group: str) -> Amount:
        return self._used.get(("group", group), Amount())

    def remaining_for_group(self, group: str) -> Limit:
        """What the group's limit still allows (all None when it has no limit)."""
        limit = self.group_limits.get(group, Limit())
        return limit.remaining(self.used_by_group(group))

    def check(self, charge: Charge) -> Reason | None:
        """None if ``charge`` fits every limit that applies; else the first excess."""
        for what, limit, used in self._applicable(charge):
            for dim, cap, u, m in limit.exceeded(used, charge.amount):
                unit = _UNITS[dim]
                msg = (f"quota of {what} exceeded: {m} {unit} asked, {u} of {cap} in use, "
                       f"{max(cap - u, 0)} left")
                return Reason("", Check.QUOTA, msg, permanent=m > cap)
        return None

    def _applicable(self, charge: Charge) -> Iterator[tuple[str, Limit, Amount]]:
        t, c, g = charge.tenant, charge.gpu_class, charge.group
        if t is not None and t in self.tenant_limits:
            yield f"tenant {t}", self.tenant_limits[t], self.used_by_tenant(t)
        if t is not None and c is not None and (t, c) in self.class_limits:
            yield f"tenant {t} for class {c}", self.class_limits[t, c], self.used_by_class(t, c)
        if g is not None and g in self.group_limits:
            yield f"group {g}", self.group_limits[g], self.used_by_group(g)


def _scopes(charge: Charge) -> list[tuple[str, ...]]:
    scopes: list[tuple[str, ...]] = []
    if charge.tenant is not None:
        scopes.append(("tenant", charge.tenant))
        if charge.gpu_class is not None:
            scopes.append(("class", charge.tenant, charge.gpu_class))
    if charge.group is not None:
        scopes.append(("group", charge.group))
    return scopes


def _set(table: dict[K, Limit], key: K, limit: Limit | None) -> None:
    if limit is None:
        table.pop(key, None)
    else:
        table[key] = limit
