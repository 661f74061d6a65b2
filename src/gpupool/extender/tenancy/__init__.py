"""Tenancy: the QuotaLedger compare-and-swap that keeps replicas within every TenantQuota
(``quotaledger``), its sharded ledger objects (``quotashards``) and the per-tenant gauges
(``tenantmetrics``)."""
