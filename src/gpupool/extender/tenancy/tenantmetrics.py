"""Per tenant, class and group quota figures, read from the cache at each scrape.

Gauges (``resource``: ``gpus``, ``memory_mib`` or ``core_pct``; a dimension a quota does
not limit has no ``nominal`` sample):

* ``gpupool_tenant_quota{tenant, resource, kind}`` with ``kind`` ``nominal`` (its limit),
  ``used`` (what its namespaces' pods hold), ``borrowed`` (beyond its nominal, in a cohort)
  and ``lent`` (its share of what its cohort's members borrow: the cohort's borrowing
  divided among the members with idle lendable quota, in proportion to that idle quota,
  rounded down);
* ``gpupool_tenant_class_quota{tenant, class, resource, kind}``: ``nominal`` and ``used``
  per class a TenantQuota limits;
* ``gpupool_group_quota{group, resource, kind}``: ``nominal`` (ResourceGroup ``spec.quota``)
  and ``used``;
* ``gpupool_tenant_pending_pods{tenant}``: GPU pods of its namespaces waiting for a node
  (``tenant=""``: namespaces no TenantQuota names).

Preemptions inside a tenant's quota and reclaims are counted by
``gpupool_extender_tenant_preemptions_total{tenant, kind}`` (``metrics``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import fields

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpupool.core.quota import Amount, Limit, QuotaBook
from gpupool.core.tenants import TenantBook
from gpupool.extender.state.cache import ClusterCache

DIMS = tuple(f.name for f in fields(Amount))


class TenancyCollector(Collector):
    """Reads the cache's catalogue under its lock when Prometheus scrapes."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache

    def collect(self) -> Iterator[GaugeMetricFamily]:
        tenant = GaugeMetricFamily("gpupool_tenant_quota", "Tenant quota figures per "
                                   "resource: nominal, used, borrowed, lent",
                                   labels=["tenant", "resource", "kind"])
        per_class = GaugeMetricFamily("gpupool_tenant_class_quota", "Per-class quota of a "
                                      "tenant: nominal and used",
                                      labels=["tenant", "class", "resource", "kind"])
        group = GaugeMetricFamily("gpupool_group_quota", "Resource group quota: nominal "
                                  "and used", labels=["group", "resource", "kind"])
        pending = GaugeMetricFamily("gpupool_tenant_pending_pods", "GPU pods waiting for a "
                                    "node, by tenant", labels=["tenant"])
        with self.cache.lock:
            self.cache.flush()
            self._tenants(tenant, per_class)
            self._groups(group)
            for name, n in sorted(self._pending().items()):
                pending.add_metric([name], n)
        yield from (tenant, per_class, group, pending)

    def _tenants(self, tenant: GaugeMetricFamily, per_class: GaugeMetricFamily) -> None:
        tenants, book = self.cache.catalogue.tenants, self.cache.catalogue.quotas
        lent = lent_by_member(tenants, book)
        for q in tenants:
            used = tenants.used(book, q)
            _limit(tenant, [q.name], q.limit)
            _amount(tenant, [q.name], used, "used")
            if q.cohort is not None:
                _amount(tenant, [q.name], tenants.cohort(book, q).borrowed(f"tenant {q.name}"),
                        "borrowed")
                _amount(tenant, [q.name], lent.get(q.name, Amount()), "lent")
            for cls, limit in q.classes:
                _limit(per_class, [q.name, cls], limit)
                _amount(per_class, [q.name, cls], tenants.used(book, q, cls), "used")

    def _groups(self, group: GaugeMetricFamily) -> None:
        book = self.cache.catalogue.quotas
        for g in self.cache.catalogue.groups:
            limit = book.group_limits.get(g.name)
            if limit is not None:
                _limit(group, [g.name], limit)
            _amount(group, [g.name], book.used_by_group(g.name), "used")

    def _pending(self) -> Counter[str]:
        tenants = self.cache.catalogue.tenants
        counts: Counter[str] = Counter()
        for uid in self.cache.unbound:
            f = self.cache.pods.get(uid)
            if f is not None and f.asks_gpu:
                counts[tenants.tenant_of(f.namespace) or ""] += 1
        return counts


def lent_by_member(tenants: TenantBook, book: QuotaBook) -> dict[str, Amount]:
    """Per tenant in a cohort, its share of what the cohort's members borrow (see module)."""
    out: dict[str, Amount] = {}
    cohorts = sorted({q.cohort for q in tenants if q.cohort is not None})
    for cohort in cohorts:
        members = [q for q in tenants if q.cohort == cohort]
        state = tenants.cohort(book, members[0])
        borrowed = {q.name: state.borrowed(f"tenant {q.name}") for q in members}
        idle = {q.name: state.lendable_idle(f"tenant {q.name}") for q in members}
        for q in members:
            out[q.name] = Amount(*(_share(getattr(idle[q.name], d),
                                          sum(getattr(i, d) for i in idle.values()),
                                          sum(getattr(b, d) for b in borrowed.values()))
                                   for d in DIMS))
    return out


def _share(mine: int, total_idle: int, total_borrowed: int) -> int:
    if total_idle <= 0:
        return 0
    return min(mine, total_borrowed * mine // total_idle)


def _limit(family: GaugeMetricFamily, labels: list[str], limit: Limit) -> None:
    for d in DIMS:
        cap = getattr(limit, d)
        if cap is not None:
            family.add_metric([*labels, d, "nominal"], cap)


def _amount(family: GaugeMetricFamily, labels: list[str], amount: Amount, kind: str) -> None:
    for d in DIMS:
        family.add_metric([*labels, d, kind], getattr(amount, d))
