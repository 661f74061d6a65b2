"""The extender's view of the cluster: one lock, one ``ClusterState``, fed by watches.

``ClusterCache`` is the single owner of the extender's mutable truth. Every
handler and every decision takes ``lock``. It keeps

* the layout: v1 Nodes + their GPUDevices -> core ``Node``s (nodes without any
  GPUDevice are not in the state: nothing gpupool manages can go there);
* holdings, keyed by pod UID, each with the *sources* that justify it:
  ``pod`` (a bound pod's decision annotation, counted only when ``decisions`` vouches
  for it or it is the pod's own GPULedger entry), ``load`` (a bound pod's CPU and
  memory without a counted decision), ``ledger`` (an entry in a node's GPULedger,
  possibly written by another replica; ``commitments`` says when one goes stale),
  ``bind`` (this replica's bind in flight) and ``assume`` (a placement handed to
  kube-scheduler's bind, until the bind comes: ``assumptions``). A key is released when
  its last source goes, and at once when its pod is deleted or finishes;
* the informer's copy of every pending, unbound pod (``unbound``): what bind decides
  from, never a request body;
* the catalogue: resource classes, groups and their quotas (charged per key);
* gangs: PodGroups' terms and every gang's members (``gangs``);
* the PodDisruptionBudgets (``budgets``), which preemption honours.

Layout changes arrive from watches at any rate; they are applied lazily
(``flush``) before each decision so a burst of GPUDevice events costs one
re-layout, not one per event. A pod event is applied at once when the lock is
free; when a decision holds it (most of the time under load) the event is
queued and applied, in order, by whoever next reads the state (every reader
flushes first), by the next event that finds the lock free, or by the periodic
``sweep``. The watch thread goes back to its socket instead of sleeping on the
lock (each such wait cost the thread and the decision a futex round trip).
GPU health follows GPUDevice status and the heartbeat age (``sweep``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpupool.contract import quotas
from gpupool.contract.devices import DeviceRecord, read_device
from gpupool.core.allocation import Allocation
from gpupool.core.eligibility import Catalogue
from gpupool.core.errors import InvalidInput, UnknownName
from gpupool.core.model import Node
from gpupool.core.state import ClusterState
from gpupool.extender.state import inventory, ledger
from gpupool.extender.state.assumptions import ASSUME_EXPIRY_S
from gpupool.extender.state.budgets import Budgets
from gpupool.extender.state.commitments import PENDING_GRACE_S, Commitments
from gpupool.extender.state.draclaims import DraClaims
from gpupool.extender.state.dramodes import NodeModes
from gpupool.extender.state.gangs import GangBook
from gpupool.extender.state.inventory import NodeFacts
from gpupool.extender.state.pods import PodFacts, facts_of
from gpupool.extender.state.signatures import DecisionCheck

log = logging.getLogger(__name__)

RELAYOUT_ALL_AT = 16  # this many dirty nodes: rebuild the whole state at once


class ClusterCache(Commitments):
    """Nodes, GPUs, pods, ledgers and the catalogue, under one lock."""

    def __init__(self, memory_unit_mib: int = 256, stale_after_s: float = 120.0,
                 ledger_grace_s: float = 300.0, clock: Callable[[], float] = time.time,
                 decisions: DecisionCheck | None = None,
                 pending_grace_s: float = PENDING_GRACE_S,
                 assume_expiry_s: float = ASSUME_EXPIRY_S):
        super().__init__(ClusterState([], memory_unit_mib), Catalogue(), clock, ledger_grace_s,
                         pending_grace_s)
        self.assumptions.expiry_s = assume_expiry_s
        self.stale_after_s = stale_after_s
        self.gpu_less_homes = False  # remote slices on: nodes without GPUs are homes too
        self.decisions = decisions or DecisionCheck(None)
        self.catalogue_version = 0
        self.nodes: dict[str, NodeFacts] = {}
        self.devices: dict[str, DeviceRecord] = {}
        self.unbound: dict[str, Any] = {}  # uid -> the informer's copy of a pending pod
        self.pods_on: dict[str, set[str]] = {}
        self.pending: deque[tuple[str, PodFacts]] = deque()  # pod events not applied yet
        self.dirty: set[str] = set()
        self.freshness: dict[str, bool] = {}  # GPUDevice -> freshness the last sweep applied
        self.budgets = Budgets()  # PodDisruptionBudgets, for preemption
        self.modes = NodeModes()  # which nodes serve their GPUs through DRA
        self.dra = DraClaims()  # ResourceSlices and ResourceClaims (held as "claim")
        self.gangs = GangBook()  # PodGroups and labelled gangs, with their members
        # fair share counts the asks of pods still pending (not yet bound, not gone)
        self.catalogue.tenants.waiting.still_waiting = lambda uid: uid in self.unbound

    def homes_without_gpus(self, on: bool) -> None:
        """Whether nodes without GPUs are in the state (remote slices: they are homes)."""
        with self.lock:
            if self.gpu_less_homes != on:
                self.gpu_less_homes = on
                self.dirty.update(self.nodes)

    # -- pods -----------------------------------------------------------------------------------
    def sync_pods(self, pods: Iterable[Any]) -> None:
        with self.lock:
            self._apply_pending()  # events of an earlier watch: older than this listing
            listed = pods if isinstance(pods, list) else list(pods)
            facts = [facts_of(p, self._counts) for p in listed]
            seen = {f.uid for f in facts}
            with self.state.deferred():  # tens of thousands of holds: rows refresh once
                for uid in [u for u in self.pods if u not in seen]:
                    self._forget_pod(uid)
                gone = self.reconcile_listing(seen)
                self.unbound = {f.uid: p for f, p in zip(facts, listed, strict=True)
                                if not f.node and not f.terminal}
                for f in facts:
                    self._apply_pod(f)
            if gone:
                log.info("released the GPU ledger entries of %d pods that are gone", len(gone))
            self.synced.add("pods")

    def pod_event(self, kind: str, pod: Any) -> None:
        f = facts_of(pod, self._counts)  # pure: outside the lock the next decision waits for
        if kind != "DELETED" and not f.node and not f.terminal:
            self.unbound[f.uid] = pod  # bind reads the pod as the API server has it
        if kind != "DELETED" and not self.pending and self.pods.get(f.uid) == f:
            return  # nothing the cache keeps changed (e.g. a status update by the kubelet)
        self.pending.append((kind, f))
        if self.lock.acquire(blocking=False):  # else the holder's next flush applies it
            try:
                self._apply_pending()
            finally:
                self.lock.release()

    def _apply_pending(self) -> None:
        """Apply the queued pod events, oldest first (under ``lock``)."""
        while self.pending:
            kind, f = self.pending.popleft()
            if kind == "DELETED":
                self._forget_pod(f.uid)
            else:
                self._apply_pod(f)

    def _counts(self, uid: str, namespace: str, name: str, notes: Mapping[str, str],
                decision: Allocation, asks_gpu: bool) -> bool:
        """Whether a pod's recorded decision may hold GPUs (``pods.DecisionFilter``): it
        must be vouched for by its signature, or be the very entry the extender wrote for
        this pod in the node's GPULedger (read without the lock: views are immutable)."""
        vouched = ledger.vouches(self.ledgers.get(decision.node), uid, namespace, name,
                                 notes, decision)
        return self.decisions.counts(uid, namespace, name, notes, asks_gpu, vouched)

    def _forget_pod(self, uid: str) -> None:
        self.unbound.pop(uid, None)
        self.gangs.gone(uid)
        f = self.pods.pop(uid, None)
        if f is not None and f.node:
            self.pods_on.get(f.node, set()).discard(uid)
        self._finish(uid)

    def _apply_pod(self, f: PodFacts) -> None:
        if f.terminal:
            self._forget_pod(f.uid)
            return
        self.gangs.pod(f)
        old = self.pods.get(f.uid)
        self.pods[f.uid] = f
        if not f.node:
            return
        self.unbound.pop(f.uid, None)
        self.pods_on.setdefault(f.node, set()).add(f.uid)
        if old is not None and old.decision is not None and f.decision != old.decision:
            self.unhold(f.uid, "pod")
        if f.decision is not None:
            self.unhold(f.uid, "load")
            self.hold(f.decision, "pod", f.charge())
        elif "ledger" not in self.sources.get(f.uid, ()) and "bind" not in self.sources.get(
                f.uid, ()):
            self.hold(f.held(), "load")

    # -- PodGroups (gangs) --------------------------------------------------------------------
    def sync_pod_groups(self, objs: Iterable[dict[str, Any]]) -> None:
        with self.lock:
            self.gangs.sync_groups(objs)
            self.synced.add("podgroups")

    def pod_group_event(self, kind: str, obj: dict[str, Any]) -> None:
        with self.lock:
            self.gangs.group_event(kind, obj)

    # -- nodes and GPUs --------------------------------------------------------------------------
    def sync_nodes(self, nodes: Iterable[Any]) -> None:
        with self.lock:
            self.nodes = {f.name: f for f in (inventory.node_facts(n) for n in nodes)}
            self._relayout_all()
            self.synced.add("nodes")

    def node_event(self, kind: str, node: Any) -> None:
        with self.lock:
            f = inventory.node_facts(node)
            if kind == "DELETED":
                self.nodes.pop(f.name, None)
            elif self.nodes.get(f.name) == f:
                return
            else:
                self.nodes[f.name] = f
            self.dirty.add(f.name)

    def sync_devices(self, objs: Iterable[dict[str, Any]]) -> None:
        with self.lock:
            self.devices = {}
            for obj in objs:
                self._put_device(obj)
            self._relayout_all()
            self.synced.add("devices")

    def device_event(self, kind: str, obj: dict[str, Any]) -> None:
        with self.lock:
            name = str((obj.get("metadata") or {}).get("name"))
            old = self.devices.get(name)
            if kind == "DELETED":
                self.devices.pop(name, None)
                if old is not None:
                    self.dirty.add(old.node)
                return
            new = self._put_device(obj)
            if new is None:
                return
            if old is None or old.node != new.node or old.gpu != new.gpu:
                self.dirty.update({new.node} | ({old.node} if old else set()))
            else:
                self._refresh_health(new)

    def _put_device(self, obj: dict[str, Any]) -> DeviceRecord | None:
        try:
            dev = read_device(obj)
        except InvalidInput as exc:
            log.warning("%s", exc)
            return None
        self.devices[dev.name] = dev
        return dev

    def _refresh_health(self, dev: DeviceRecord) -> None:
        self.freshness.pop(dev.name, None)  # the next sweep looks at it again
        i = self.state.index.get(dev.node)
        if i is None:
            return
        healthy = inventory.is_fresh(dev, self.clock(), self.stale_after_s)
        try:
            j = self.state.gpu_position(dev.node, dev.gpu.uuid)
        except UnknownName:
            self.dirty.add(dev.node)
            return
        if bool(self.state.healthy[i, j]) != healthy:
            self.state.set_health(dev.node, dev.gpu.uuid, healthy)

    def sweep(self) -> None:
        """Mark GPUs whose heartbeat went stale unhealthy (and fresh ones healthy again);
        release the holds of ledger entries that turned stale (``commitments``) and the
        assumptions whose bind never came."""
        with self.lock:
            self._apply_pending()  # a pod deleted meanwhile releases its entries
            now = self.clock()
            self.expire_assumptions(now)
            for dev in self.devices.values():  # touch the state only where freshness flipped
                fresh = inventory.is_fresh(dev, now, self.stale_after_s)
                if self.freshness.get(dev.name) != fresh:
                    self._refresh_health(dev)
                    self.freshness[dev.name] = fresh
            self.release_stale_entries()

    # -- layout ------------------------------------------------------------------------------------
    def flush(self) -> None:
        """Apply queued pod events and pending layout changes, end expired assumptions
        (call under ``lock`` before reading the state)."""
        self._apply_pending()
        if self.assumptions.by_key:
            self.expire_assumptions(self.clock())
        if not self.dirty:
            return
        self.freshness.clear()  # health was re-derived: the next sweep checks every GPU
        if len(self.dirty) >= RELAYOUT_ALL_AT:
            self._relayout_all()
            return
        for name in sorted(self.dirty):
            self._relayout_node(name)
        self.dirty.clear()

    def _core_nodes(self) -> dict[str, Node]:
        by_node: dict[str, list[DeviceRecord]] = {}
        for dev in self.devices.values():
            by_node.setdefault(dev.node, []).append(dev)
        now = self.clock()
        return {name: inventory.build_node(f, by_node.get(name, ()), now, self.stale_after_s)
                for name, f in self.nodes.items() if name in by_node or self.gpu_less_homes}

    def _relayout_all(self) -> None:
        """Rebuild the state from scratch and hold everything again."""
        self.dirty.clear()
        self.freshness.clear()
        nodes = self._core_nodes()
        kept = [(a, self.sources.get(a.key, set()), self.charges.get(a.key))
                for a in self.state.allocations.values()]
        self.state = ClusterState(sorted(nodes.values(), key=lambda n: n.name),
                                  self.state.memory_unit_mib)
        self.sources.clear()
        for key in list(self.charges):
            self.catalogue.quotas.refund(key)
        self.charges.clear()
        with self.state.deferred():  # every holding again: rows refresh once
            for alloc, sources, charge in kept:
                for source in sorted(sources):
                    self.hold(alloc, source, charge)
            self._hold_all(self.pods.values(), self.ledgers.values())
            for node in list(self.waiting):
                self._retry(node)
            self.dra.hold_all(self)

    def _hold_all(self, pods: Iterable[PodFacts], views: Iterable[ledger.View]) -> None:
        for f in pods:
            if f.node and f.node in self.state.index:
                self._apply_pod(f)
        for view in views:
            if view.node in self.state.index:
                self._hold_ledger(view)

    def _relayout_node(self, name: str) -> None:
        devs = [d for d in self.devices.values() if d.node == name]
        facts = self.nodes.get(name)
        present = name in self.state.index
        if facts is None or not (devs or self.gpu_less_homes):
            if present:
                for alloc in self.state.remove_node(name):
                    self.sources.pop(alloc.key, None)
                    if self.charges.pop(alloc.key, None) is not None:
                        self.catalogue.quotas.refund(alloc.key)
            return
        node = inventory.build_node(facts, devs, self.clock(), self.stale_after_s)
        if present:
            for alloc in self.state.replace_node(node):
                self.sources.pop(alloc.key, None)
        else:
            self.state.add_nodes([node])
        pods = [self.pods[u] for u in self.pods_on.get(name, ()) if u in self.pods]
        self._hold_all(pods, [v for v in [self.ledgers.get(name)] if v is not None])
        self.dra.hold_node(self, name)

    # -- disruption budgets ---------------------------------------------------------------------
    def sync_budgets(self, objs: Iterable[dict[str, Any]]) -> None:
        with self.lock:
            self.budgets.sync(objs)
            self.synced.add("budgets")

    def budget_event(self, kind: str, obj: dict[str, Any]) -> None:
        with self.lock:
            self.budgets.event(kind, obj)

    # -- catalogue -----------------------------------------------------------------------------
    def sync_classes(self, objs: Iterable[dict[str, Any]]) -> None:
        with self.lock:
            for name in self.catalogue.classes.names():
                self.catalogue.classes.remove(name)
            for obj in objs:
                self.class_event("ADDED", obj)
            self.synced.add("classes")

    def class_event(self, kind: str, obj: dict[str, Any]) -> None:
        with self.lock:
            self.catalogue_version += 1
            name = str((obj.get("metadata") or {}).get("name"))
            if kind == "DELETED":
                self.catalogue.classes.remove(name)
                return
            try:
                self.catalogue.classes.put(inventory.resource_class(obj))
            except InvalidInput as exc:
                log.warning("ResourceClass %s ignored: %s", name, exc)

    def sync_groups(self, objs: Iterable[dict[str, Any]]) -> None:
        with self.lock:
            for g in list(self.catalogue.groups):
                self.group_event("DELETED", {"metadata": {"name": g.name}})
            for obj in objs:
                self.group_event("ADDED", obj)
            self.synced.add("groups")

    def group_event(self, kind: str, obj: dict[str, Any]) -> None:
        with self.lock:
            self.catalogue_version += 1
            name = str((obj.get("metadata") or {}).get("name"))
            if kind == "DELETED":
                self.catalogue.groups.remove(name)
                self.catalogue.quotas.set_group_limit(name, None)
                return
            try:
                group, limit = inventory.resource_group(obj)
            except InvalidInput as exc:
                log.warning("ResourceGroup %s ignored: %s", name, exc)
                return
            self.catalogue.groups.put(group)
            self.catalogue.quotas.set_group_limit(name, limit)

    # -- tenancy: tenant quotas and GPU permissions ---------------------------------------------
    def sync_tenant_quotas(self, objs: Iterable[dict[str, Any]]) -> None:
        with self.lock:
            for quota in list(self.catalogue.tenants):
                self.catalogue.tenants.remove(quota.name)
            for obj in objs:
                self.tenant_quota_event("ADDED", obj)
            self.synced.add("tenantquotas")

    def tenant_quota_event(self, kind: str, obj: dict[str, Any]) -> None:
        with self.lock:
            self.catalogue_version += 1
            name = str((obj.get("metadata") or {}).get("name"))
            self.catalogue.tenants.remove(name)
            if kind == "DELETED":
                return
            quota = quotas.quota_of(obj)
            if isinstance(quota, quotas.Broken):
                log.warning("%s", quota.message)
                return
            self.catalogue.tenants.put(quota)

    def sync_permissions(self, objs: Iterable[dict[str, Any]]) -> None:
        with self.lock:
            for name in list(self.catalogue.permissions.by_name):
                self.catalogue.permissions.remove(name)
            for obj in objs:
                self.permission_event("ADDED", obj)
            self.synced.add("gpupermissions")

    def permission_event(self, kind: str, obj: dict[str, Any]) -> None:
        with self.lock:
            self.catalogue_version += 1
            name = str((obj.get("metadata") or {}).get("name"))
            self.catalogue.permissions.remove(name)
            if kind == "DELETED":
                return
            permission = quotas.permission_or_denial(obj)
            if isinstance(permission, quotas.Broken):
                log.warning("%s", permission.message)
                return
            self.catalogue.permissions.put(permission)
