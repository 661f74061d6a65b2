"""Which namespace labels a TenantQuota's ``namespaceSelector`` may read.

A tenant may label its own namespace, so a selector over any label it can write would let
it join another tenant's quota (and preempt that tenant's pods inside it). A selector may
therefore use only keys that tenants cannot write: those under ``tenant.gpupool.io/``
(the chart's admission policy lets only the configured admin groups add, change or remove
them) and ``kubernetes.io/metadata.name`` (the API server sets it to the namespace's name).

Pure: no I/O.
"""

from __future__ import annotations

from gpupool.core.selector import Selector

RESERVED_PREFIX = "tenant.gpupool.io/"
NAME_KEY = "kubernetes.io/metadata.name"


def trusted_key(key: str) -> bool:
    return key == NAME_KEY or (key.startswith(RESERVED_PREFIX) and len(key) > len(
        RESERVED_PREFIX))


def untrusted_keys(selector: Selector) -> list[str]:
    """The selector's label keys a tenant could write (sorted, each once)."""
    keys = {k for k, _ in selector.match_labels} | {r.key for r in selector.expressions}
    return sorted(k for k in keys if not trusted_key(k))


def why_untrusted(keys: list[str]) -> str:
    """A sentence a person can act on, naming the keys."""
    return (f"spec.namespaceSelector uses label key(s) {', '.join(keys)}, which a tenant "
            f"can write on its own namespace; a selector may use only keys under "
            f"{RESERVED_PREFIX} (only admins may set them) or {NAME_KEY}")
