"""Permissions: which nodes and GPUs a tenant may group and draw from.

A ``Permission`` says that the pods of some namespaces may use only the GPUs on nodes its
node selector matches and that its GPU selector matches. A namespace named by no
permission is not restricted; one named by several may use the union of what they permit.
Planning (automatic groups) and filtering both use ``PermissionBook``.

Pure: no I/O; masks are cached per cluster epoch like class and group masks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpupool.core.books import NamedBook
from gpupool.core.classes import selector_mask
from gpupool.core.model import Gpu, Node
from gpupool.core.reasons import Check, Reason
from gpupool.core.selector import Selector
from gpupool.core.state import BoolArray, ClusterState


@dataclass(frozen=True, slots=True)
class Permission:
    """Pods of ``tenants`` (namespaces) may use GPUs on nodes ``nodes`` matches (None: any
    node) that ``gpus`` matches (None: any GPU)."""

    name: str
    tenants: frozenset[str]
    nodes: Selector | None = None
    gpus: Selector | None = None
    broken: str = ""  # why the object cannot be read: it then permits nothing

    def __post_init__(self) -> None:
        object.__setattr__(self, "tenants", frozenset(self.tenants))

    def permits(self, node: Node, gpu: Gpu) -> bool:
        if self.broken:
            return False
        if self.nodes is not None and not self.nodes.matches(dict(node.labels)):
            return False
        return self.gpus is None or self.gpus.matches(gpu.label_map())

    def describe(self) -> str:
        if self.broken:
            return f"GPUPermission {self.name} (broken, permits nothing: {self.broken})"
        nodes = self.nodes.describe() if self.nodes is not None else "any node"
        gpus = self.gpus.describe() if self.gpus is not None else "any GPU"
        return f"GPUPermission {self.name} (nodes: {nodes}; GPUs: {gpus})"


class PermissionBook(NamedBook[Permission, BoolArray | None]):
    """Permissions by name; per tenant, the GPUs they permit (cached per epoch)."""

    noun = "GPUPermission"

    @property
    def by_name(self) -> dict[str, Permission]:
        """The permissions by name (the book's own table: change it through ``put``)."""
        return self._items

    def of(self, tenant: str | None) -> tuple[Permission, ...]:
        """The permissions naming ``tenant`` (none: the tenant is not restricted)."""
        return tuple(self._items[n] for n in sorted(self._items)
                     if tenant is not None and tenant in self._items[n].tenants)

    def names_of(self, tenant: str | None) -> str:
        return ", ".join(p.name for p in self.of(tenant))

    def permitted(self, nodes: Sequence[Node], tenant: str) -> frozenset[str] | None:
        """Uuids of the GPUs ``tenant`` may use among ``nodes`` (None: all of them)."""
        perms = self.of(tenant)
        if not perms:
            return None
        return frozenset(g.uuid for n in nodes for g in n.gpus
                         if any(p.permits(n, g) for p in perms))

    def mask(self, state: ClusterState, tenant: str | None) -> BoolArray | None:
        """[node, gpu] -> ``tenant`` may use the GPU (None: no restriction); read-only."""
        table = self._cache.masks_for(state)
        if tenant in table:
            return table[tenant]
        perms = self.of(tenant)
        key = ("permissions", tuple(p.name for p in perms))  # tenants with equal sets share
        mask = None if not perms else table.get(key)
        if perms and mask is None:
            mask = table[key] = _mask(state, perms)
        table[tenant] = mask
        return mask

    def narrowed(self, state: ClusterState, tenant: str | None, gpu_mask: BoolArray | None
                 ) -> BoolArray | None:
        """``gpu_mask`` within what ``tenant`` may use: one read-only object per pair and
        epoch (scorers and the group catalogue key their caches on the mask's identity)."""
        permitted = self.mask(state, tenant)
        if permitted is None:
            return gpu_mask
        if gpu_mask is None:
            return permitted
        return self._intersect(state, tenant, permitted, gpu_mask)

    def refusal(self, state: ClusterState, tenant: str | None, gpu_mask: BoolArray | None,
                what: str) -> Reason | None:
        """A permanent refusal when ``tenant`` may use none of ``gpu_mask``'s present GPUs."""
        narrowed = self.narrowed(state, tenant, gpu_mask)
        if narrowed is None or narrowed is gpu_mask or bool((narrowed & state.present).any()):
            return None
        perms = "; ".join(p.describe() for p in self.of(tenant))
        return Reason("", Check.GROUP, f"tenant {tenant} may use no {what} under its "
                      f"permissions: {perms}", True)


def _mask(state: ClusterState, perms: Sequence[Permission]) -> BoolArray:
    """[node, gpu] -> some permission of ``perms`` permits the GPU: node selectors once per
    node, GPU selectors once per set of equal GPU facts (``classes.selector_mask``)."""
    mask = np.zeros(state.present.shape, np.bool_)
    for p in perms:
        if p.broken:
            continue
        allowed = state.present.copy()
        if p.nodes is not None:
            rows = np.array([p.nodes.matches(dict(n.labels)) for n in state.nodes], np.bool_)
            allowed &= rows.reshape(-1, 1)
        if p.gpus is not None:
            allowed &= selector_mask(state, p.gpus)
        mask |= allowed
    mask.flags.writeable = False
    return mask
