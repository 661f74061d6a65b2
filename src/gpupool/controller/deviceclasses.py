"""DeviceClasses for DRA nodes, kept in line with gpupool's classes.

The controller maintains (label ``app.kubernetes.io/managed-by: gpupool-controller``;
a DeviceClass without it is a user's and is left alone):

* ``gpu.gpupool.io``: every gpupool device (``device.driver == 'gpu.gpupool.io'``), MIG
  devices included;
* ``mig.gpupool.io``: every MIG device (a claim selects the profile with CEL on the
  ``migProfile`` attribute);
* ``<class>.gpupool.io`` for every valid ``ResourceClass`` — the default class of each
  GPU model among them — its selector translated to CEL (``celselector``), kept to GPUs
  that are no MIG device unless the selector names ``gpupool.io/mig-profile``;
* ``<model>.gpupool.io`` for a GPU model without a ResourceClass of its default class
  name yet (the default ResourceClass appears a round later and takes the name over),
  without MIG devices.

With ``extended_resources`` (clusters with the ``DRAExtendedResource`` feature), the
class of ``<class>`` also carries ``extendedResourceName: class.gpupool.io/<class>`` and
``gpu.gpupool.io`` carries ``gpupool.io/gpu``: pods asking those resources by name are
then served through DRA on DRA nodes (one whole GPU per unit).

``plan`` is pure; ``DeviceClassSync`` lists what exists and applies the plan. A cluster
that does not serve ``resource.k8s.io/v1`` is noted once and skipped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpupool.contract import dra
from gpupool.contract.tenancy import Broken, class_of
from gpupool.controller.celselector import class_cel
from gpupool.controller.defaults import CONTROLLER, MANAGED_BY, class_name_for, is_owned
from gpupool.controller.observed import Observed, name_of
from gpupool.core import mig
from gpupool.core.classes import ResourceClass, resource_name
from gpupool.core.errors import GpupoolError, InvalidInput
from gpupool.core.selector import Operator, Requirement, Selector
from gpupool.kube.errors import NotFound

log = logging.getLogger(__name__)
Obj = dict[str, Any]
SUFFIX = ".gpupool.io"
MIG_CLASS = "mig" + SUFFIX
ANNOTATION_SOURCE = "gpupool.io/resource-class"
"""On a DeviceClass: the ResourceClass (or ``model:<name>``) it was made from."""


def device_class(name: str, selector: Selector, source: str, extended: str | None) -> Obj:
    spec: Obj = {"selectors": [{"cel": {"expression": class_cel(selector)}}]}
    if extended:
        spec["extendedResourceName"] = extended
    return {"apiVersion": dra.API_VERSION, "kind": "DeviceClass",
            "metadata": {"name": name, "labels": {MANAGED_BY: CONTROLLER},
                         "annotations": {ANNOTATION_SOURCE: source}},
            "spec": spec}


def desired(classes: Iterable[ResourceClass], models: Iterable[str], extended: bool
            ) -> tuple[dict[str, Obj], list[str]]:
    """The DeviceClasses gpupool wants, by name, and notes on classes it cannot translate."""
    want = {dra.DRIVER: device_class(dra.DRIVER, Selector(), "*",
                                     "gpupool.io/gpu" if extended else None),
            MIG_CLASS: device_class(MIG_CLASS, Selector((), (
                Requirement(mig.LABEL_PROFILE, Operator.EXISTS, ()),)), "mig", None)}
    notes = []
    covered: set[str] = set()
    for rc in sorted(classes, key=lambda c: c.name):
        name = rc.name + SUFFIX
        if name in want:
            notes.append(f"ResourceClass {rc.name}: its DeviceClass name {name} is gpupool's "
                         "own; rename the class to use it through DRA")
            continue
        try:
            want[name] = device_class(name, whole_gpus(rc.selector), rc.name,
                                      resource_name(rc.name) if extended else None)
        except InvalidInput as exc:
            notes.append(f"ResourceClass {rc.name} has no DeviceClass: {exc}")
            continue
        covered.add(rc.name)
    for model in sorted(set(models)):
        slug = class_name_for(model)
        if slug in covered:  # the model's default ResourceClass (or a user's of that name)
            continue
        selector = whole_gpus(Selector((), (
            Requirement("gpupool.io/model", Operator.IN, (model,)),)))
        want.setdefault(slug + SUFFIX, device_class(slug + SUFFIX, selector, f"model:{model}",
                                                    None))
    return want, notes


def whole_gpus(selector: Selector) -> Selector:
    """``selector`` kept to GPUs that are no MIG device, unless it selects on the MIG
    profile itself (a class of MIG devices)."""
    keys = {k for k, _ in selector.match_labels} | {r.key for r in selector.expressions}
    if mig.LABEL_PROFILE in keys:
        return selector
    return Selector(selector.match_labels, (*selector.expressions, Requirement(
        mig.LABEL_PROFILE, Operator.DOES_NOT_EXIST, ())))


@dataclass(frozen=True, slots=True)
class Change:
    op: str  # create | replace | delete
    name: str
    body: Obj = field(default_factory=dict)


def plan(want: Mapping[str, Obj], existing: Iterable[Obj]) -> list[Change]:
    """Creates, replaces and deletes that make the controller's DeviceClasses ``want``."""
    have = {name_of(o): o for o in existing}
    changes = []
    for name, body in sorted(want.items()):
        cur = have.get(name)
        if cur is None:
            changes.append(Change("create", name, body))
        elif not is_owned(cur):
            continue
        elif cur.get("spec") != body["spec"] or _meta(cur) != _meta(body):
            meta = {**cur.get("metadata", {}), **body["metadata"]}
            changes.append(Change("replace", name, {**body, "metadata": meta}))
    changes += [Change("delete", n) for n, o in sorted(have.items())
                if n not in want and is_owned(o)]
    return changes


def _meta(obj: Mapping[str, Any]) -> tuple[Any, Any]:
    meta = obj.get("metadata") or {}
    return (meta.get("labels") or {}).get(MANAGED_BY), (meta.get("annotations") or {}).get(
        ANNOTATION_SOURCE)


class DeviceClassApi(Protocol):
    def list_device_classes(self) -> list[Obj]: ...

    def create_device_class(self, obj: Mapping[str, Any]) -> Obj: ...

    def replace_device_class(self, obj: Mapping[str, Any]) -> Obj: ...

    def delete_device_class(self, name: str) -> None: ...


@dataclass(slots=True)
class SyncResult:
    written: list[str] = field(default_factory=list)  # "created X", "updated Y", ...
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: int = 0  # writes not sent because the leader's term ended first


class DeviceClassSync:
    """Applies ``plan`` each round through a ``DeviceClassApi``."""

    def __init__(self, api: DeviceClassApi, extended_resources: bool = False):
        self.api = api
        self.extended = extended_resources
        self.served = True
        self._last_notes: list[str] = []

    def sync(self, observed: Observed, ended: threading.Event | None = None) -> SyncResult:
        """Bring the DeviceClasses in line; once ``ended`` (the leader's term) is set, no
        further write is sent (the rest are counted in ``skipped``)."""
        out = SyncResult()
        if not self.served:
            return out
        classes = [c for c in (class_of(o, name_of(o)) for o in observed.classes)
                   if not isinstance(c, Broken)]
        want, out.notes = desired(classes, (p.gpu.model for p in observed.gpus), self.extended)
        for note in out.notes:
            if note not in self._last_notes:
                log.warning("%s", note)
        self._last_notes = out.notes
        try:
            existing = self.api.list_device_classes()
        except NotFound:
            self.served = False
            log.warning("the API server does not serve resource.k8s.io/v1 DeviceClasses: "
                        "no DRA classes are maintained (Kubernetes 1.34 or later needed)")
            return out
        except GpupoolError as exc:
            out.failures.append(str(exc))
            return out
        changes = plan(want, existing)
        for i, change in enumerate(changes):
            if ended is not None and ended.is_set():
                out.skipped = len(changes) - i
                break
            try:
                self._apply(change)
                out.written.append(f"{change.op} DeviceClass {change.name}")
            except GpupoolError as exc:
                out.failures.append(str(exc))
        return out

    def _apply(self, change: Change) -> None:
        if change.op == "create":
            self.api.create_device_class(change.body)
        elif change.op == "replace":
            self.api.replace_device_class(change.body)
        else:
            self.api.delete_device_class(change.name)
