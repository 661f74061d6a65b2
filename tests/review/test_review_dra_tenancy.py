"""Review: ResourceClaims escape TenantQuota and GPUPermission.

A tenant may create ResourceClaims in its namespaces. kube-scheduler allocates them on
DRA nodes, and the extender holds each allocated claim in its state (the GPU is taken)
but charges it to nobody: a tenant whose TenantQuota allows 0 GPUs still gets GPUs on
DRA nodes, and its other namespaces' quota never sees them. (Pods with claims ask no
gpupool resource, so the scheduler never sends them to the extender's filter either,
where GPUPermissions are enforced.) docs/tenancy.md does not say so.
"""

from __future__ import annotations

from gpupool.core.tenants import TenantBook, TenantQuota
from tests.extender.test_dra_accounting import mixed_cache, recorded, with_claims


@recorded
def test_claims_allocated_in_a_tenants_namespace_count_against_its_quota() -> None:
    cache = with_claims(mixed_cache())  # two recorded claims of namespace dra-demo, one A100
    quota = TenantQuota("demo", frozenset({"dra-demo"}))
    used = TenantBook([quota]).used(cache.catalogue.quotas, quota)
    # each claim holds a slice of the one A100 (10 GiB, 30 %); a slice counts 1 GPU, as a
    # device-plugin pod's slice does (docs/tenancy.md), so the two claims count 2
    assert (used.gpus, used.memory_mib, used.core_pct) == (2, 2 * 10240, 2 * 30)
