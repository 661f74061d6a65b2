"""Tenants as a running system sets them: tenant quotas over sets of namespaces, their
cohorts and fair share; and (re-exported) permissions.

A ``TenantQuota`` names a tenant (its own name) and the namespaces that make it up. Its
``limit`` is the tenant's nominal quota, summed over those namespaces; ``classes`` holds
per-class limits (``class.gpupool.io/<class>`` pods of the tenant). The cohort fields
(``cohort``, ``borrowing_limit``, ``lending_limit``, ``weight``) are carried for the cohort
arithmetic (``core.cohort``); this module only adds up what the namespaces use and refuses
what would pass a limit, in the same words as ``QuotaBook.check``:
``quota of tenant team-a exceeded: 2 GPUs asked, 7 of 8 in use, 1 left``.

In a cohort that shares fairly (a member's ``fair_sharing``), a borrow is also held to the
member's fair share of what the cohort lends, over what the members hold and what their
waiting pods ask (``core.tenantshare``; the asks are noted in ``TenantBook.waiting`` when a
pod is checked with its key).

Permissions (``Permission``, ``PermissionBook``) live in ``core.permissions`` and are
re-exported here. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from gpupool.core.cohort import Admission, CohortMember, CohortState, Verdict, admit
from gpupool.core.errors import InvalidInput
from gpupool.core.permissions import Permission, PermissionBook
from gpupool.core.quota import Amount, Charge, Limit, QuotaBook
from gpupool.core.reasons import Check, Reason
from gpupool.core.selector import Selector
from gpupool.core.tenantshare import WaitingAsks, beyond_fair_share, surely_within

__all__ = ["Permission", "PermissionBook", "TenantBook", "TenantQuota", "member_of"]

_UNITS = {"gpus": "GPUs", "memory_mib": "MiB of GPU memory", "core_pct": "% of GPU compute"}


@dataclass(frozen=True, slots=True)
class TenantQuota:
    """A tenant: its namespaces, nominal limit, per-class limits and cohort settings.

    ``borrowing_limit`` None: may borrow whatever its cohort lends; ``lending_limit``
    None: lends all it does not use. ``weight`` divides idle capacity in fair share.
    """

    name: str
    namespaces: frozenset[str]
    limit: Limit = field(default_factory=Limit)
    classes: tuple[tuple[str, Limit], ...] = ()
    cohort: str | None = None
    borrowing_limit: Limit | None = None
    lending_limit: Limit | None = None
    weight: int = 1
    namespace_selector: Selector | None = None  # namespaces by label (resolved elsewhere)
    fair_sharing: bool = False  # its cohort divides what it lends by weight (any member)

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidInput("a tenant quota needs a name")
        if self.weight < 0:
            raise InvalidInput(f"tenant {self.name}: weight must be >= 0, got {self.weight}")
        object.__setattr__(self, "namespaces", frozenset(self.namespaces))

    def limit_of(self, dim: int) -> int | None:
        """The nominal limit of dimension ``dim`` (0 GPUs, 1 memory, 2 compute)."""
        return (self.limit.gpus, self.limit.memory_mib, self.limit.core_pct)[dim]

    def class_limit(self, gpu_class: str | None) -> Limit | None:
        return next((lim for name, lim in self.classes if name == gpu_class), None)


class TenantBook:
    """Tenant quotas by name, and which quotas cover each namespace."""

    def __init__(self, quotas: Iterable[TenantQuota] = ()) -> None:
        self.by_name: dict[str, TenantQuota] = {}
        self._covering: dict[str, tuple[TenantQuota, ...]] = {}
        self._sorted: tuple[TenantQuota, ...] = ()
        self._members: dict[str, CohortMember] = {}
        self._peers: dict[str, tuple[TenantQuota, ...]] = {}
        self._capacity: dict[str, tuple[int, ...]] = {}  # cohort -> the pool per dimension
        self._totals: dict[tuple[int, str], tuple[int, int, int]] = {}
        self._totals_of: QuotaBook | None = None
        self._states: dict[tuple[int, str], CohortState] = {}
        self._states_of: QuotaBook | None = None
        self._fair: frozenset[str] = frozenset()  # cohorts that share fairly
        self.waiting = WaitingAsks()  # what waiting pods ask, for fair share
        for q in quotas:
            self.put(q)

    def put(self, quota: TenantQuota) -> None:
        self.by_name[quota.name] = quota
        self._index()

    def remove(self, name: str) -> TenantQuota | None:
        gone = self.by_name.pop(name, None)
        self._index()
        return gone

    def _index(self) -> None:
        covering: dict[str, list[TenantQuota]] = {}
        peers: dict[str, list[TenantQuota]] = {}
        for name in sorted(self.by_name):
            q = self.by_name[name]
            for ns in q.namespaces:
                covering.setdefault(ns, []).append(q)
            if q.cohort is not None:
                peers.setdefault(q.cohort, []).append(q)
        self._covering = {ns: tuple(qs) for ns, qs in covering.items()}
        self._sorted = tuple(self.by_name[n] for n in sorted(self.by_name))
        self._members = {q.name: member_of(q) for q in self._sorted}
        self._peers = {c: tuple(qs) for c, qs in peers.items()}
        self._fair = frozenset(c for c, qs in peers.items() if any(q.fair_sharing for q in qs))
        self._totals, self._states = {}, {}
        self._capacity = {c: tuple(sum(self._members[q.name].lendable(d) for q in qs)
                                   for d in ("gpus", "memory_mib", "core_pct"))
                          for c, qs in peers.items()}

    def __len__(self) -> int:
        return len(self.by_name)

    def __iter__(self) -> Iterator[TenantQuota]:
        return iter(self._sorted)

    def covering(self, namespace: str | None) -> tuple[TenantQuota, ...]:
        """The quotas whose tenant includes ``namespace`` (by name)."""
        return self._covering.get(namespace or "", ())

    def tenant_of(self, namespace: str | None) -> str | None:
        """The first covering tenant's name (None: the namespace belongs to none)."""
        found = self.covering(namespace)
        return found[0].name if found else None

    def shares_fairly(self, cohort: str | None) -> bool:
        """Whether ``cohort`` divides what it lends by weight (a member asked for it)."""
        return cohort in self._fair

    def waiting_by_member(self, book: QuotaBook, cohort: str, but: str | None = None
                          ) -> dict[str, Amount]:
        """What the waiting pods of ``cohort``'s members ask, by member (``tenant <name>``),
        pod ``but`` left out; pods no longer waiting (gone, or charged in ``book``: placed)
        are forgotten on the way."""
        by_ns = self.waiting.by_namespace(but, book.charged)
        out: dict[str, Amount] = {}
        for q in self._peers.get(cohort, ()):
            total = Amount()
            for ns in q.namespaces & by_ns.keys():
                total = total + by_ns[ns]
            out[f"tenant {q.name}"] = total
        return out

    def overlaps(self) -> dict[str, tuple[str, ...]]:
        """Namespaces claimed by more than one tenant (every such quota applies)."""
        return {ns: tuple(q.name for q in qs) for ns, qs in sorted(self._covering.items())
                if len(qs) > 1}

    @staticmethod
    def used(book: QuotaBook, quota: TenantQuota, gpu_class: str | None = None) -> Amount:
        """What the tenant's namespaces hold (of ``gpu_class`` only, when given)."""
        g = m = c = 0
        for ns in quota.namespaces:
            a = book.used_by_tenant(ns) if gpu_class is None else \
                book.used_by_class(ns, gpu_class)
            g, m, c = g + a.gpus, m + a.memory_mib, c + a.core_pct
        return Amount(g, m, c)

    def _cohort_total(self, book: QuotaBook, cohort: str) -> tuple[int, int, int]:
        """What the cohort's members use in all, per dimension (remembered while neither
        the book's charges nor the quotas change)."""
        if book is not self._totals_of:  # another book: nothing remembered holds for it
            self._totals, self._totals_of = {}, book
        key = (book.version, cohort)
        found = self._totals.get(key)
        if found is None:
            g = m = c = 0
            for q in self._peers.get(cohort, ()):
                a = self.used(book, q)
                g, m, c = g + a.gpus, m + a.memory_mib, c + a.core_pct
            if len(self._totals) > 64:
                self._totals.clear()
            found = self._totals[key] = (g, m, c)
        return found

    def _surely_fits(self, book: QuotaBook, quota: TenantQuota, amount: Amount) -> bool:
        """A cheap sufficient condition for the cohort arithmetic's *fits*: within the
        nominal, and even if every peer drew all it uses from the pool, the pool would
        hold it (a draw is never more than the usage). Saves building the cohort's state
        for the common case of a cohort far from full."""
        used = self.used(book, quota)
        if any(m > 0 and cap is not None and u + m > cap for cap, u, m in _dims(
                quota.limit, used, amount)):
            return False
        totals = self._cohort_total(book, quota.cohort or "")
        capacity = self._capacity.get(quota.cohort or "", (0, 0, 0))
        asked = (amount.gpus, amount.memory_mib, amount.core_pct)
        return all(m <= 0 or quota.limit_of(i) is None or t + m <= cap
                   for i, (t, m, cap) in enumerate(zip(totals, asked, capacity, strict=True)))

    def _fair_surely(self, book: QuotaBook, quota: TenantQuota, amount: Amount) -> bool:
        """``surely_within`` from remembered totals: what the cohort's members use, plus
        ``amount``, plus every waiting ask, fits the cohort's pool. (Per dimension,
        borrowed − unused nominal = used − nominal, and what a member lends idle is at least
        its unused nominal less its guaranteed part; so this implies ``surely_within``.)"""
        totals = self._cohort_total(book, quota.cohort or "")
        capacity = self._capacity.get(quota.cohort or "", (0, 0, 0))
        asked = (amount.gpus, amount.memory_mib, amount.core_pct)
        waits = (self.waiting.total.gpus, self.waiting.total.memory_mib,
                 self.waiting.total.core_pct)
        return all(m <= 0 or quota.limit_of(i) is None or t + m + w <= cap for i, (t, m, w, cap)
                   in enumerate(zip(totals, asked, waits, capacity, strict=True)))

    def cohort(self, book: QuotaBook, quota: TenantQuota) -> CohortState:
        """The cohort arithmetic's view of ``quota``'s cohort: members named
        ``tenant <name>``, each using what its namespaces hold (remembered while neither
        the book's charges nor the quotas change; states are values)."""
        if quota.cohort is None or self.by_name.get(quota.name) is not quota:
            return self._state(book, quota)
        if book is not self._states_of:
            self._states, self._states_of = {}, book
        key = (book.version, quota.cohort)
        found = self._states.get(key)
        if found is None:
            if len(self._states) > 16:
                self._states.clear()
            found = self._states[key] = self._state(book, quota)
        return found

    def _state(self, book: QuotaBook, quota: TenantQuota) -> CohortState:
        peers = self._peers.get(quota.cohort, (quota,)) if quota.cohort else (quota,)
        members = {f"tenant {q.name}": self._members.get(q.name) or member_of(q)
                   for q in peers}
        return CohortState(members, {f"tenant {q.name}": self.used(book, q) for q in peers})

    def fair_refusal(self, book: QuotaBook, quota: TenantQuota, amount: Amount,
                     key: str | None = None, state: CohortState | None = None
                     ) -> Reason | None:
        """Why borrowing for ``amount`` would take ``quota``'s tenant beyond its fair share
        of what its cohort lends (None: it would not); pod ``key``'s own ask is not counted
        twice. Never permanent: shares change as the others' pods start and end."""
        cohort, me = quota.cohort or "", f"tenant {quota.name}"
        if self._fair_surely(book, quota, amount):
            return None
        state = state or self.cohort(book, quota)
        if surely_within(state, me, amount, self.waiting.total):
            return None
        found = beyond_fair_share(state, me, amount,
                                  self.waiting_by_member(book, cohort, but=key))
        return None if found is None else Reason("", Check.QUOTA, found.reason(), False)

    def admission(self, book: QuotaBook, quota: TenantQuota, amount: Amount) -> Admission:
        """How ``amount`` more stands against the tenant's nominal quota and its cohort."""
        return admit(self.cohort(book, quota), f"tenant {quota.name}", amount)

    def check(self, book: QuotaBook, charge: Charge, key: str | None = None
              ) -> Reason | None:
        """None if ``charge`` (tenant = a namespace) fits every tenant quota covering it;
        in a cohort, beyond the nominal only by borrowing what the cohort lends (in a cohort
        that shares fairly, only up to the member's fair share while others wait too), and a
        charge that needs lent capacity back waits (not permanent) while it is reclaimed.
        ``key``: the pod's, noted as waiting in a cohort that shares fairly."""
        for quota in self.covering(charge.tenant):
            if quota.cohort is None:
                reason = _excess(f"tenant {quota.name}", quota.limit,
                                 self.used(book, quota), charge.amount)
            elif self._surely_fits(book, quota, charge.amount):
                reason = None
            else:
                state = self.cohort(book, quota)
                found = admit(state, f"tenant {quota.name}", charge.amount)
                reason = None if found.admitted else Reason(
                    "", Check.QUOTA, found.reason,
                    found.permanent and found.verdict is not Verdict.RECLAIMS)
                if found.verdict is Verdict.BORROWS and self.shares_fairly(quota.cohort):
                    reason = self.fair_refusal(book, quota, charge.amount, key, state)
            if key is not None and self.shares_fairly(quota.cohort):
                self.waiting.note(key, charge.tenant, charge.amount)
            if reason is None and charge.gpu_class is not None:
                limit = quota.class_limit(charge.gpu_class)
                if limit is not None:
                    reason = _excess(f"tenant {quota.name} for class {charge.gpu_class}",
                                     limit, self.used(book, quota, charge.gpu_class),
                                     charge.amount)
            if reason is not None:
                return reason
        return None


def _dims(limit: Limit, used: Amount, asked: Amount) -> Iterator[tuple[int | None, int, int]]:
    yield limit.gpus, used.gpus, asked.gpus
    yield limit.memory_mib, used.memory_mib, asked.memory_mib
    yield limit.core_pct, used.core_pct, asked.core_pct


def member_of(quota: TenantQuota) -> CohortMember:
    """The cohort member a tenant quota is (named ``tenant <name>``)."""
    return CohortMember(f"tenant {quota.name}", quota.limit, quota.cohort,
                        quota.borrowing_limit, quota.lending_limit, quota.weight)


def _excess(what: str, limit: Limit, used: Amount, asked: Amount) -> Reason | None:
    for dim, cap, u, m in limit.exceeded(used, asked):
        msg = (f"quota of {what} exceeded: {m} {_UNITS[dim]} asked, {u} of {cap} in use, "
               f"{max(cap - u, 0)} left")
        return Reason("", Check.QUOTA, msg, permanent=m > cap)
    return None
