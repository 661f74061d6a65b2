"""The thin loop: observe (list + watch), ``reconcile``, apply the plan; never crash.

``Controller.reconcile_once`` lists everything and applies one plan (``gpupool
controller --once``). ``Controller.run`` keeps a ``WorldCache`` fed by one
``Informer`` per kind (GPUDevices, ResourceClasses, ResourceGroups, pods);
any event marks the world dirty, and the loop reconciles from the cache after
a short quiet period, and at the latest every ``resync_s``. A failed write
(a conflict, the API being away) is logged and retried on the next round —
the plan is recomputed from what is observed then, so retries are safe.

``run``'s ``stop`` is the leader's term (``leader.lead``): once it is set, the round in
flight sends no further write (the rest are counted as skipped and logged), so a replica
that lost the Lease does not undo the new leader's work from its stale view.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from gpupool.contract.quotas import Broken as BrokenObject
from gpupool.contract.quotas import permission_or_denial
from gpupool.controller import fairstatus, groupsync, quotastatus
from gpupool.controller.catalogue import catalogue_of
from gpupool.controller.deviceclasses import DeviceClassSync
from gpupool.controller.evictions import Evictor
from gpupool.controller.migplanner import MigPlanner
from gpupool.controller.observed import Obj, Observed, Tenancy, Verify, observe
from gpupool.controller.reconcile import (
    CLASS,
    Action,
    CreateClass,
    DeleteClass,
    PatchClass,
    PatchStatus,
    Plan,
    reconcile,
)
from gpupool.controller.remotepreemptor import RemotePreemptor
from gpupool.controller.slicekeeper import SliceKeeper
from gpupool.core.errors import GpupoolError
from gpupool.core.model import Labels, freeze_labels
from gpupool.core.tenants import PermissionBook
from gpupool.kube.api import KubeApi, Listing
from gpupool.kube.controller_ops import ControllerApi, pod_json
from gpupool.kube.errors import KubeError
from gpupool.kube.informer import Feed, Informer

log = logging.getLogger(__name__)

KINDS = ("gpudevices", "resourceclasses", "resourcegroups", "pods")
QUIET_S = 0.2
"""After an event, wait this long for more before reconciling (a burst is one round)."""
SLICE_CHECK_S = 5.0
"""While remote slices are served, rounds come at least this often (their servers'
deadlines are counted between rounds)."""


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(slots=True)
class Outcome:
    """What one round did: writes by kind, failed writes, and notes for a person."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    notes: tuple[str, ...] = ()
    device_classes: list[str] = field(default_factory=list)  # "create DeviceClass x", ...
    skipped: int = 0  # writes not sent: the leader's term ended during the round
    fair_shares: tuple[Any, ...] = ()  # fairstatus.FairShareFigure per tenant sharing fairly

    @property
    def writes(self) -> int:
        return len(self.created) + len(self.updated) + len(self.deleted) + \
            len(self.statuses) + len(self.device_classes)

    def summary(self) -> str:
        return (f"{len(self.created)} classes created, {len(self.updated)} updated, "
                f"{len(self.deleted)} deleted, {len(self.statuses)} statuses written, "
                f"{len(self.failures)} writes failed, {len(self.notes)} notes"
                + (f", {len(self.device_classes)} DeviceClass writes"
                   if self.device_classes else "")
                + (f", {self.skipped} writes skipped (the term ended)" if self.skipped else ""))


def _key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")


class WorldCache:
    """The objects of each kind as the informers last saw them (one lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[str, dict[str, Obj]] = {k: {} for k in KINDS}
        self.dirty = threading.Event()

    def sync(self, kind: str, items: Iterable[Any]) -> None:
        objs = [pod_json(o) if kind == "pods" else dict(o) for o in items]
        with self._lock:
            self._objects[kind] = {_key(o): o for o in objs}
        self.dirty.set()

    def event(self, kind: str, event: str, obj: Any) -> None:
        o = pod_json(obj) if kind == "pods" else dict(obj)
        with self._lock:
            if event == "DELETED":
                self._objects[kind].pop(_key(o), None)
            else:
                self._objects[kind][_key(o)] = o
        self.dirty.set()

    def observed(self, verify: Verify | None) -> Observed:
        with self._lock:
            devices, classes, groups, pods = (list(self._objects[k].values()) for k in KINDS)
        return observe(devices, classes, groups, pods, verify)

    def objects(self, kind: str) -> list[Obj]:
        """The objects of ``kind`` as last seen (the dicts themselves: do not change them)."""
        with self._lock:
            return list(self._objects[kind].values())


def _feeds() -> dict[str, Feed[Any]]:
    def watch_pods(api: KubeApi, rv: str, t: int) -> Iterator[tuple[str, Any]]:
        return api.watch_pods(rv, timeout_s=t)

    return {
        "gpudevices": Feed("gpudevices", lambda a: a.list_gpu_devices(),
                           lambda a, rv, t: a.watch_gpu_devices(rv, timeout_s=t)),
        "resourceclasses": Feed("resourceclasses", lambda a: a.list_resource_classes(),
                                lambda a, rv, t: a.watch_resource_classes(rv, t)),
        "resourcegroups": Feed("resourcegroups", lambda a: a.list_resource_groups(),
                               lambda a, rv, t: a.watch_resource_groups(rv, t)),
        "pods": Feed("pods", lambda a: a.list_pods(), watch_pods),
    }


class Controller:
    """Applies ``reconcile``'s plans through a ``ControllerApi``."""

    def __init__(self, api: ControllerApi, clock: Callable[[], str] = utc_now, *,
                 verify: Verify | None, device_classes: DeviceClassSync | None = None,
                 observer: RoundObserver | None = None, evictor: Evictor | None = None,
                 mig: MigPlanner | None = None, slices: SliceKeeper | None = None,
                 preemptor: RemotePreemptor | None = None):
        """``verify`` checks each decision's signature (``KeyRingSource.verify``, which
        remembers outcomes until the published keys change); None
        counts unsigned decisions too (only for clusters without gpupool's extender).
        ``device_classes`` also keeps the DRA DeviceClasses in line, after each round.
        ``observer`` is told of every round of ``run`` (metrics). ``evictor`` heals (evicts
        the pods of failed GPUs and silent nodes) after each round of ``run``."""
        self.observer = observer
        self.evictor = evictor
        self.mig = mig  # MIG on demand (``migplanner``): None, off
        self.slices = slices  # remote slices' servers (``slicekeeper``): None, none
        self.preemptor = preemptor  # preemption for remote slices (``remotepreemptor``)
        self.api = api
        self.device_classes = device_classes
        self.clock = clock
        self.verify = verify
        self.listed_pods: list[Any] = []  # the pods the last ``list_world`` listed
        self._last_notes: tuple[str, ...] = ()

    def list_world(self) -> Observed:
        def items(listing: Listing[Any]) -> list[Obj]:
            return [dict(o) for o in listing.items]
        devices = items(self.api.list_gpu_devices())
        classes, groups = items(self.api.list_resource_classes()), \
            items(self.api.list_resource_groups())
        self.listed_pods = self.api.list_pods_json().items
        return observe(devices, classes, groups, self.listed_pods, self.verify)

    def reconcile_once(self, ended: threading.Event | None = None) -> Outcome:
        """List everything, reconcile, apply (no write once ``ended`` is set)."""
        observed = self.list_world()
        out = self._with_device_classes(
            observed, self.apply(reconcile(observed, self.clock()), ended), ended)
        try:
            tenancy = TenancyWorld.listed(self.api)
        except KubeError as exc:
            out.failures.append(str(exc))
            return out
        return self._with_tenancy(observed, out, tenancy, ended, self.listed_pods)

    def _with_device_classes(self, observed: Observed, out: Outcome,
                             ended: threading.Event | None = None) -> Outcome:
        if self.device_classes is None:
            return out
        if _over(ended):
            log.warning("the leader's term ended: DeviceClasses not synced this round")
            return out
        result = self.device_classes.sync(observed, ended)
        _skip(out, result.skipped)
        out.device_classes.extend(result.written)
        out.failures.extend(result.failures)
        out.notes = out.notes + tuple(result.notes)
        return out

    def apply(self, plan: Plan, ended: threading.Event | None = None) -> Outcome:
        """Send the plan's writes in order; once ``ended`` is set, send no more."""
        out = Outcome(notes=plan.notes)
        not_created: set[str] = set()  # a class whose create failed has no status to write
        for i, action in enumerate(plan.actions):
            if _over(ended):
                _skip(out, len(plan.actions) - i)
                break
            if isinstance(action, PatchStatus) and action.kind == CLASS and \
                    action.name in not_created:
                continue
            try:
                self._apply(action, out)
            except KubeError as exc:
                if isinstance(action, CreateClass):
                    not_created.add(str(action.obj["metadata"]["name"]))
                out.failures.append(str(exc))
                log.warning("%s (retried next round)", exc)
        self._log_notes(plan.notes)
        return out

    def _apply(self, action: Action, out: Outcome) -> None:
        if isinstance(action, CreateClass):
            self.api.create_resource_class(action.obj)
            out.created.append(str(action.obj["metadata"]["name"]))
        elif isinstance(action, PatchClass):
            self.api.patch_resource_class(action.name, action.patch, action.resource_version)
            out.updated.append(action.name)
        elif isinstance(action, DeleteClass):
            self.api.delete_resource_class(action.name)
            out.deleted.append(action.name)
        elif isinstance(action, PatchStatus):
            if action.kind == CLASS:
                self.api.patch_resource_class_status(action.name, action.patch)
            else:
                self.api.patch_resource_group_status(action.name, action.patch)
            out.statuses.append(f"{action.kind}/{action.name}")

    def _with_tenancy(self, observed: Observed, out: Outcome, tenancy: TenancyWorld,
                      ended: threading.Event | None = None, pods: Iterable[Obj] = ()
                      ) -> Outcome:
        """Resource groups' members (automatic groups planned, ``groupsync``), then
        TenantQuota and GPUPermission status (``quotastatus``); a failed write is logged
        and retried next round. Nothing until ``tenancy`` has listed every kind it needs."""
        if not tenancy.ready():
            return out
        labels, permissions, quotas, namespaces = tenancy.snapshot()
        book = PermissionBook(p for p in map(permission_or_denial, permissions)
                              if not isinstance(p, BrokenObject))
        writes: list[tuple[str, str, Obj]] = [
            ("ResourceGroup", p.name, p.patch) for p in groupsync.plan(observed, labels, book)]
        nodes = groupsync.core_nodes(observed, labels)
        done = quotastatus.read(observed, quotas, namespaces)  # once for both
        fair = quotastatus.fair_shares(observed, quotas, pods, namespaces, done)
        out.fair_shares = fairstatus.figures(fair)
        writes += [(p.kind, p.name, p.patch) for p in
                   quotastatus.plan(observed, quotas, permissions, nodes, self.clock(),
                                    namespaces, fair, done)]
        patchers = {"ResourceGroup": self.api.patch_resource_group_status,
                    "TenantQuota": self.api.patch_tenant_quota_status,
                    "GPUPermission": self.api.patch_gpu_permission_status}
        for i, (kind, name, patch) in enumerate(writes):
            if _over(ended):
                _skip(out, len(writes) - i)
                break
            try:
                patchers[kind](name, patch)
                out.statuses.append(f"{kind}/{name}")
            except KubeError as exc:
                out.failures.append(str(exc))
                log.warning("%s (retried next round)", exc)
        return out

    def _log_notes(self, notes: tuple[str, ...]) -> None:
        for note in notes:
            if note not in self._last_notes:
                log.warning("%s", note)
        self._last_notes = notes

    def run(self, stop: threading.Event, resync_s: float = 300.0,
            on_round: Callable[[Outcome], None] | None = None, watch_timeout_s: int = 300
            ) -> None:
        """Watch and reconcile until ``stop`` is set. The watch threads are told to stop
        and given a moment; one blocked on a quiet stream ends with it (``watch_timeout_s``)."""
        world = WorldCache()
        informers = [_informer(self.api, world, kind, feed, watch_timeout_s)
                     for kind, feed in _feeds().items()]
        tenancy = TenancyWorld(world.dirty)
        late = tenancy.informers(self.api, watch_timeout_s)  # not waited for (TenancyWorld)
        try:
            for inf in informers:
                while not inf.synced.wait(0.1):
                    if stop.is_set():
                        return
            while not stop.is_set():
                world.dirty.clear()
                started = time.monotonic()
                observed = world.observed(self.verify)
                outcome = self._with_device_classes(
                    observed, self.apply(reconcile(observed, self.clock()), stop), stop)
                outcome = self._with_tenancy(observed, outcome, tenancy, stop,
                                             world.objects("pods"))
                if outcome.writes or outcome.failures:
                    log.info("reconciled: %s", outcome.summary())
                wait = min(self._heal(observed, world, stop, resync_s),
                           self._keep_slices(observed, world, stop, resync_s),
                           self._preempt_remote(observed, world, tenancy, stop, resync_s))
                if self.mig is not None and not stop.is_set():
                    self.mig.round(with_tenancy_view(observed, tenancy),
                                   world.objects("gpudevices"), world.objects("pods"))
                if self.observer is not None:
                    self.observer(observed, world, outcome, time.monotonic() - started)
                if on_round is not None:
                    on_round(outcome)
                _wait_for_work(world, stop, wait)
        finally:
            for inf in [*informers, *late]:
                inf.signal_stop()
            for inf in [*informers, *late]:
                inf.join(0.5)


    def _heal(self, observed: Observed, world: WorldCache, stop: threading.Event,
              resync_s: float) -> float:
        """Heal (``evictions.Evictor``); how long to wait for the next round: ``resync_s``,
        or less when a grace or a retry ends sooner."""
        if self.evictor is None:
            return resync_s
        plan = self.evictor.heal(world.objects("gpudevices"), observed, world.objects("pods"),
                                 stop)
        if plan.next_s is None:
            return resync_s
        return min(resync_s, max(plan.next_s - self.evictor.clock(), QUIET_S))

    def _keep_slices(self, observed: Observed, world: WorldCache, stop: threading.Event,
                     resync_s: float) -> float:
        """Keep the servers of remote slices (``slicekeeper.SliceKeeper``); how long to wait
        for the next round: while any slice is served, at most ``SLICE_CHECK_S`` (a server
        that stops answering is noticed within its deadline)."""
        if self.slices is None:
            return resync_s
        done = self.slices.keep(observed, world.objects("pods"), world.objects("gpudevices"),
                                stop)
        return min(resync_s, SLICE_CHECK_S) if done is not None else resync_s

    def _preempt_remote(self, observed: Observed, world: WorldCache, tenancy: TenancyWorld,
                        stop: threading.Event, resync_s: float) -> float:
        """Preempt for pending remote-required pods (``remotepreemptor.RemotePreemptor``);
        how long to wait for the next round: ``resync_s``, or less when a pod's grace, a
        deferral, a retry or a promise ends sooner."""
        if self.preemptor is None:
            return resync_s
        if not tenancy.ready():  # a quota not yet listed is no quota: evict nobody for it
            return resync_s
        labels, permissions, quotas, _ = tenancy.snapshot()
        pods = world.objects("pods")
        catalogue = catalogue_of(observed, quotas, permissions)
        try:
            plan = self.preemptor.round(observed, pods, labels, catalogue, stop)
        except GpupoolError as exc:  # a bug: logged, the loop goes on
            log.error("remote preemption: the round could not be planned: %s", exc)
            return resync_s
        if plan.next_s is None:
            return resync_s
        return min(resync_s, max(plan.next_s - self.preemptor.clock(), QUIET_S))


def _over(ended: threading.Event | None) -> bool:
    return ended is not None and ended.is_set()


def _skip(out: Outcome, count: int) -> None:
    if count:
        out.skipped += count
        log.warning("the leader's term ended mid-round: %d writes not sent", count)


RoundObserver = Callable[[Observed, WorldCache, Outcome, float], None]
"""Told after each round of ``Controller.run``: what was observed, the objects it was
observed from, what the round did, and how long it took in seconds."""


def _informer(api: KubeApi, world: WorldCache, kind: str, feed: Feed[Any], watch_timeout_s: int
              ) -> Informer[Any]:
    def on_sync(items: list[Any]) -> None:
        world.sync(kind, items)

    def on_event(event: str, obj: Any) -> None:
        world.event(kind, event, obj)

    return Informer(api, feed, on_sync, on_event, watch_timeout_s).start()


def _wait_for_work(world: WorldCache, stop: threading.Event, resync_s: float) -> None:
    """Until an event (then a quiet period), ``resync_s`` passed, or ``stop``."""
    waited = 0.0
    while not stop.is_set() and waited < resync_s:
        if world.dirty.wait(min(0.5, resync_s - waited)):
            stop.wait(QUIET_S)
            return
        waited += 0.5


def with_tenancy_view(observed: Observed, tenancy: TenancyWorld) -> Observed:
    """``observed`` with the TenantQuotas, GPUPermissions and node labels MIG on demand
    checks pods against; unchanged (``tenancy`` None: the planner plans nothing) until
    every kind is listed."""
    if not tenancy.ready():
        return observed
    labels, permissions, quotas, _ = tenancy.snapshot()
    return replace(observed, tenancy=Tenancy(tuple(quotas), tuple(permissions), labels))


class TenancyWorld:
    """Node and namespace labels, GPUPermissions and TenantQuotas as the informers last saw
    them (for
    ``groupsync`` and ``quotastatus``). A node event marks the world dirty only when the
    node's labels changed (its status changes all the time and plans nothing).

    Its informers are not waited for at start: a cluster upgraded without the TenantQuota
    and GPUPermission CRDs (Helm installs new CRDs only on install) answers 404, and the
    rest of the controller must go on; until every kind is listed, ``ready`` is False and
    no group is planned and no tenancy status written (planning on half a world would move
    members)."""

    def __init__(self, dirty: threading.Event | None = None) -> None:
        self._lock = threading.Lock()
        self.dirty = dirty or threading.Event()
        self.labels: dict[str, Labels] = {}
        self.namespaces: dict[str, Labels] = {}  # namespace -> its labels
        self.objects: dict[str, dict[str, Obj]] = {"gpupermissions": {}, "tenantquotas": {}}
        self._informers: list[Informer[Any]] = []  # none: listed at once (``listed``)

    @staticmethod
    def listed(api: ControllerApi) -> TenancyWorld:
        world = TenancyWorld()
        world.sync_nodes(api.list_nodes().items)
        world.sync("gpupermissions", api.list_gpu_permissions().items)
        world.sync("tenantquotas", api.list_tenant_quotas().items)
        world.sync_namespaces(api.list_namespaces().items)
        return world

    def ready(self) -> bool:
        return all(inf.synced.is_set() for inf in self._informers)

    def snapshot(self) -> tuple[dict[str, Labels], list[Obj], list[Obj], dict[str, Labels]]:
        with self._lock:
            return (dict(self.labels), list(self.objects["gpupermissions"].values()),
                    list(self.objects["tenantquotas"].values()), dict(self.namespaces))

    def sync_namespaces(self, namespaces: Iterable[Any]) -> None:
        with self._lock:
            self.namespaces = {str(n.metadata.name): freeze_labels(n.metadata.labels)
                               for n in namespaces}
        self.dirty.set()

    def namespace_event(self, event: str, ns: Any) -> None:
        name, labels = str(ns.metadata.name), freeze_labels(ns.metadata.labels)
        with self._lock:
            if event == "DELETED":
                self.namespaces.pop(name, None)
            elif self.namespaces.get(name) == labels:
                return
            else:
                self.namespaces[name] = labels
        self.dirty.set()

    def sync_nodes(self, nodes: Iterable[Any]) -> None:
        with self._lock:
            self.labels = {str(n.metadata.name): freeze_labels(n.metadata.labels)
                           for n in nodes}
        self.dirty.set()

    def node_event(self, event: str, node: Any) -> None:
        name, labels = str(node.metadata.name), freeze_labels(node.metadata.labels)
        with self._lock:
            if event == "DELETED":
                self.labels.pop(name, None)
            elif self.labels.get(name) == labels:
                return
            else:
                self.labels[name] = labels
        self.dirty.set()

    def sync(self, kind: str, items: Iterable[Any]) -> None:
        with self._lock:
            self.objects[kind] = {_key(dict(o)): dict(o) for o in items}
        self.dirty.set()

    def event(self, kind: str, event: str, obj: Any) -> None:
        o = dict(obj)
        with self._lock:
            if event == "DELETED":
                self.objects[kind].pop(_key(o), None)
            else:
                self.objects[kind][_key(o)] = o
        self.dirty.set()

    def informers(self, api: KubeApi, watch_timeout_s: int) -> list[Informer[Any]]:
        nodes: Feed[Any] = Feed("nodes", lambda a: a.list_nodes(),
                                lambda a, rv, t: a.watch_nodes(rv, t))
        spaces: Feed[Any] = Feed("namespaces", lambda a: a.list_namespaces(),
                                 lambda a, rv, t: a.watch_namespaces(rv, t))
        out = [Informer(api, nodes, self.sync_nodes, self.node_event, watch_timeout_s).start(),
               Informer(api, spaces, self.sync_namespaces, self.namespace_event,
                        watch_timeout_s).start()]
        for kind, feed in (
                ("gpupermissions", Feed("gpupermissions", lambda a: a.list_gpu_permissions(),
                                        lambda a, rv, t: a.watch_gpu_permissions(rv, t))),
                ("tenantquotas", Feed("tenantquotas", lambda a: a.list_tenant_quotas(),
                                      lambda a, rv, t: a.watch_tenant_quotas(rv, t)))):
            out.append(Informer(api, feed, _synced(self, kind), _evented(self, kind),
                                watch_timeout_s).start())
        self._informers = out
        return out


def _synced(world: TenancyWorld, kind: str) -> Callable[[list[Any]], None]:
    return lambda items: world.sync(kind, items)


def _evented(world: TenancyWorld, kind: str) -> Callable[[str, Any], None]:
    return lambda event, obj: world.event(kind, event, obj)
