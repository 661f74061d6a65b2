"""The extender's accounting of ResourceClaims: what kube-scheduler allocated on DRA nodes.

``DraClaims`` keeps, under the cluster cache's lock, the devices of gpupool's
ResourceSlices and every ResourceClaim (its identity, its device requests, whether it is
allocated). An allocated claim on gpupool's devices is decoded by
``gpupool.contract.dra`` and held in the cache's ``ClusterState`` under the key
``resourceclaim/<uid>`` with the source ``claim``: the same state, the same arithmetic as
the device-plugin path, so a GPU's room counts every claim and every gpupool decision once.
The pods of a claim hold only their CPU and memory (the claim holds the GPU).

Every held claim is charged (``Charge``) to its namespace, which is the tenant of its
pods, and to the ResourceClass its DeviceClass ``<class>.gpupool.io`` names when the
extender knows that class (the class of the request or ``firstAvailable`` sub-request the
allocation gave devices to; several classes: the first of those): TenantQuota and
ResourceClass quota status, the tenant metrics and the filter of device-plugin pods count
GPUs taken through claims as they count any other. A claim belongs to no ResourceGroup
(nothing charges a group).

A claim is held again when its allocation changes, let go when it is deallocated or
deleted, and held again after a node's layout changes (``hold_node``, ``hold_all``). A
claim that names a device no slice publishes is read against the GPUs the node's
GPUDevices describe (a device's name carries the GPU's index); one that still cannot be
read is logged once and listed in ``unreadable``, and nothing is held for it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpupool.contract.dra import (
    DRIVER,
    ClaimHolding,
    DeviceTable,
    DraDevice,
    allocation_of,
    devices_of_node,
    read_claim,
    read_slice,
)
from gpupool.core.allocation import Allocation
from gpupool.core.deviceselectors import CelDevice, device_of
from gpupool.core.eligibility import Catalogue
from gpupool.core.errors import InvalidInput, UnknownName
from gpupool.core.quota import Charge, amount_of_allocation
from gpupool.core.state import ClusterState
from gpupool.extender.state.dramodes import is_dra_node

log = logging.getLogger(__name__)

SOURCE = "claim"
CLASS_SUFFIX = ".gpupool.io"  # gpupool's DeviceClasses: gpu.gpupool.io, <class>.gpupool.io


class Holder(Protocol):
    """What ``DraClaims`` needs of the cluster cache."""

    state: ClusterState
    catalogue: Catalogue

    def hold(self, alloc: Allocation, source: str, charge: Any = None) -> bool: ...

    def unhold(self, key: str, source: str) -> None: ...


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    """What is kept of one ResourceClaim."""

    uid: str
    namespace: str
    name: str
    requests: tuple[Mapping[str, Any], ...]  # spec.devices.requests as the API server has it
    allocated: bool
    constraints: tuple[Mapping[str, Any], ...] = ()  # spec.devices.constraints


class DraClaims:
    """ResourceSlices' devices and ResourceClaims, the allocated ones held in the state."""

    def __init__(self) -> None:
        self.slices: dict[str, list[DraDevice]] = {}  # slice name -> its devices
        self.claims: dict[str, ClaimRecord] = {}  # uid -> record
        self.by_name: dict[tuple[str, str], str] = {}  # (namespace, name) -> uid
        self.objects: dict[str, Mapping[str, Any]] = {}  # uid -> the allocated claim as read
        self.holdings: dict[str, ClaimHolding] = {}  # uid -> what it holds
        self.unreadable: dict[str, str] = {}  # uid -> why it is not held
        self.by_pool: dict[str, set[str]] = {}  # pool -> uids of allocated claims naming it
        self.synced: set[str] = set()
        self.selectable: dict[str, dict[tuple[str, str], CelDevice]] = {}
        """slice name -> (node, GPU uuid) -> the device as CEL selectors see it."""
        self.devices_version = 0  # goes up whenever a slice's devices change
        self._table: DeviceTable | None = None
        self._table_layout: object | None = None

    # -- slices ---------------------------------------------------------------------------
    def sync_slices(self, cache: Holder, objs: Iterable[Mapping[str, Any]]) -> None:
        self.slices = {}
        self.selectable = {}
        self.devices_version += 1
        for obj in objs:
            self._put_slice(obj)
        self.synced.add("resourceslices")
        self._reread(cache)

    def slice_event(self, cache: Holder, kind: str, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name"))
        before = self.slices.get(name)
        if kind == "DELETED":
            self.slices.pop(name, None)
            self.selectable.pop(name, None)
            self.devices_version += 1
        else:
            self._put_slice(obj)
        after = self.slices.get(name)
        if after != before:  # read again only the claims on this slice's pools
            self._table = None
            pools = {d.pool for d in (before or []) + (after or [])}
            for uid in sorted({u for p in pools for u in self.by_pool.get(p, ())}):
                self._apply(cache, uid)

    def _put_slice(self, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name"))
        try:
            devices = read_slice(obj)
        except InvalidInput as exc:
            log.warning("%s", exc)
            self.slices.pop(name, None)
            self.selectable.pop(name, None)
            return
        if devices:
            self.slices[name] = devices
        self._put_selectable(name, obj, devices)

    def _put_selectable(self, name: str, obj: Mapping[str, Any], devices: list[DraDevice]
                        ) -> None:
        """The slice's devices as selectors see them (every attribute and capacity)."""
        raw = (obj.get("spec") or {}).get("devices") or []
        by_name = {d.name: d for d in devices}
        found = {}
        for entry in raw if isinstance(raw, list) else ():
            dev = by_name.get(str(entry.get("name"))) if isinstance(entry, Mapping) else None
            if dev is not None:
                found[(dev.node, dev.uuid)] = device_of(entry, DRIVER)
        if found != self.selectable.get(name):
            self.devices_version += 1
        if found:
            self.selectable[name] = found
        else:
            self.selectable.pop(name, None)

    # -- claims ---------------------------------------------------------------------------
    def sync_claims(self, cache: Holder, objs: Iterable[Mapping[str, Any]]) -> None:
        listed = {}
        for obj in objs:
            record = record_of(obj)
            if record is not None:
                listed[record.uid] = obj
        for uid in [u for u in self.claims if u not in listed]:
            self._forget(cache, uid)
        for obj in listed.values():
            self.claim_event(cache, "ADDED", obj)
        self.synced.add("resourceclaims")

    def claim_event(self, cache: Holder, kind: str, obj: Mapping[str, Any]) -> None:
        record = record_of(obj)
        if record is None:
            log.warning("a ResourceClaim without metadata.uid or name is ignored")
            return
        if kind == "DELETED":
            self._forget(cache, record.uid)
            return
        self.claims[record.uid] = record
        self.by_name[(record.namespace, record.name)] = record.uid
        self._unindex(record.uid)
        if record.allocated:
            self.objects[record.uid] = obj
            for pool in pools_of(obj):
                self.by_pool.setdefault(pool, set()).add(record.uid)
        else:
            self.objects.pop(record.uid, None)
        self._apply(cache, record.uid)

    def _unindex(self, uid: str) -> None:
        obj = self.objects.get(uid)
        for pool in pools_of(obj) if obj is not None else ():
            uids = self.by_pool.get(pool)
            if uids is not None:
                uids.discard(uid)
                if not uids:
                    del self.by_pool[pool]

    def _forget(self, cache: Holder, uid: str) -> None:
        record = self.claims.pop(uid, None)
        if record is not None and self.by_name.get((record.namespace, record.name)) == uid:
            del self.by_name[(record.namespace, record.name)]
        self._unindex(uid)
        self.objects.pop(uid, None)
        self.unreadable.pop(uid, None)
        old = self.holdings.pop(uid, None)
        if old is not None:
            cache.unhold(old.key, SOURCE)

    # -- holding --------------------------------------------------------------------------
    def _apply(self, cache: Holder, uid: str) -> None:
        """Hold what the claim holds now (and let go of what it held before)."""
        holding = self._read(cache.state, uid)
        old = self.holdings.get(uid)
        if old is not None and old != holding:
            cache.unhold(old.key, SOURCE)
            del self.holdings[uid]
        if holding is not None:
            self.holdings[uid] = holding
            self._hold(cache, holding)

    def _read(self, state: ClusterState, uid: str) -> ClaimHolding | None:
        obj = self.objects.get(uid)
        if obj is None:
            return None
        try:
            holding = read_claim(obj, self.table(state))
        except InvalidInput as exc:
            if self.unreadable.get(uid) != str(exc):
                log.warning("not counted: %s", exc)
            self.unreadable[uid] = str(exc)
            return None
        self.unreadable.pop(uid, None)
        return holding

    def _hold(self, cache: Holder, holding: ClaimHolding) -> None:
        state = cache.state
        if holding.node not in state.index:
            return  # held once the node is laid out (hold_node)
        try:
            alloc = allocation_of(holding, state.gpu_position, state.memory_unit_mib)
        except UnknownName as exc:
            self.unreadable[holding.uid] = str(exc)
            log.warning("ResourceClaim %s not counted: %s", holding.ref, exc)
            return
        if not cache.hold(alloc, SOURCE, self.charge_of(cache, holding, alloc)):
            log.info("ResourceClaim %s waits for room on %s (its GPUs look taken)", holding.ref,
                     holding.node)

    def charge_of(self, cache: Holder, holding: ClaimHolding, alloc: Allocation) -> Charge:
        """What the claim counts against: its namespace, and its class when known."""
        record = self.claims.get(holding.uid)
        known = frozenset(cache.catalogue.classes.names())
        allocated = frozenset(g.request for g in holding.gpus)
        cls = claim_class(record, known, allocated) if record is not None else None
        return Charge(amount_of_allocation(alloc), holding.namespace or "default", cls)

    def hold_node(self, cache: Holder, node: str) -> None:
        """Hold the claims of ``node`` again (its layout changed)."""
        for holding in list(self.holdings.values()):
            if holding.node == node and holding.key not in cache.state.allocations:
                self._hold(cache, holding)

    def hold_all(self, cache: Holder) -> None:
        """Hold every claim that is not held (the whole layout changed)."""
        self._reread(cache)

    def _reread(self, cache: Holder) -> None:
        """Read every allocated claim again (devices or layout changed) and hold it."""
        self._table = None
        for uid in list(self.objects):
            self._apply(cache, uid)
        for uid in [u for u in self.holdings if u not in self.objects]:
            cache.unhold(self.holdings.pop(uid).key, SOURCE)
        for holding in self.holdings.values():
            if holding.key not in cache.state.allocations:
                self._hold(cache, holding)

    def table(self, state: ClusterState) -> DeviceTable:
        """Devices by (pool, name): the slices', and for pools no slice describes, the GPUs
        the state knows of the DRA node of that name."""
        if self._table is None or self._table_layout is not state.layout:
            table: DeviceTable = {}
            for node in (n for n in state.nodes if is_dra_node(n)):
                table.update(devices_of_node(node.name, node.gpus, state.memory_unit_mib))
            for devices in self.slices.values():
                table.update({(d.pool, d.name): d for d in devices})
            self._table, self._table_layout = table, state.layout
        return self._table

    def record(self, namespace: str, name: str) -> ClaimRecord | None:
        uid = self.by_name.get((namespace, name))
        return self.claims.get(uid) if uid is not None else None


def record_of(obj: Mapping[str, Any]) -> ClaimRecord | None:
    """The record of a claim object (None without uid or name)."""
    meta = obj.get("metadata") or {}
    uid, name = meta.get("uid"), meta.get("name")
    if not isinstance(uid, str) or not uid or not isinstance(name, str) or not name:
        return None
    spec = obj.get("spec") or {}
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    status = obj.get("status") or {}
    allocated = isinstance(status, Mapping) and bool(status.get("allocation"))
    constraints = devices.get("constraints") if isinstance(devices, Mapping) else None
    return ClaimRecord(uid, str(meta.get("namespace") or "default"), name,
                       tuple(r for r in requests or () if isinstance(r, Mapping))
                       if isinstance(requests, list) else (), allocated,
                       tuple(c for c in constraints if isinstance(c, Mapping))
                       if isinstance(constraints, list) else ())


def claim_class(record: ClaimRecord, known: frozenset[str],
                allocated: frozenset[str] | None = None) -> str | None:
    """The first ResourceClass among ``known`` that the claim's gpupool requests name
    (``<class>.gpupool.io``; ``gpu.gpupool.io`` names none). ``allocated``: the request
    names the allocation's results carry (``req`` or ``req/sub``): only those count, so a
    ``firstAvailable`` is charged to the class of the sub-request it was given."""
    for raw in record.requests:
        req = str(raw.get("name") or "")
        first = raw.get("firstAvailable")
        asks = [(req, raw.get("exactly")), *(
            (f"{req}/{a.get('name') if isinstance(a, Mapping) else ''}", a)
            for a in (first if isinstance(first, list) else ()))]
        for label, ask in asks:
            if not isinstance(ask, Mapping) or \
                    (allocated is not None and label not in allocated):
                continue
            name = ask.get("deviceClassName")
            if isinstance(name, str) and name.endswith(CLASS_SUFFIX) and name != DRIVER:
                cls = name[:-len(CLASS_SUFFIX)]
                if cls in known:
                    return cls
    return None


def pools_of(obj: Mapping[str, Any]) -> set[str]:
    """The pools an allocated claim's results name."""
    status = obj.get("status") or {}
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    results = devices.get("results") if isinstance(devices, Mapping) else None
    return {str(r.get("pool")) for r in results or () if isinstance(r, Mapping)} \
        if isinstance(results, list) else set()
