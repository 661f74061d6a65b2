"""Preemption for remote slices, the hold: the room a preemption makes is written in the
serving node's GPULedger before anyone is evicted, so that no other pod takes it.

The extender honours such a hold (``gpupool.contract.ledger``: ``kind: hold``, ``expires``,
``displaces``): while it lives, its victims count nothing and the hold counts in their
place, so pods arriving after the evictions are refused that room, and the pod it is for
is served there (its bind replaces the hold). ``RemoteHolds`` is what the controller's
preemptor asks of the ledgers:

* ``read``: every GPULedger, decoded (one list per round in which some pod may preempt);
* ``holding``: whether a pod already has a live hold or a bind in any of them (a second
  round, or a new leader, never writes a second hold for one pod);
* ``write``: the same fit check the extender runs (``FitCheck``, the victims counted out,
  expired holds and holds of bound pods dropped), then a compare-and-swap at the version
  read; a conflict, no room, or any error writes nothing and says why (the pod is
  planned again in a later round);
* ``remove``: drop the pod's hold, only while it is still one, at the version written
  (after an eviction was refused, as the extender does for its own preemptions); a hold
  that cannot be removed expires.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from gpupool.contract import names
from gpupool.contract.ledger import (
    HOLD,
    Entry,
    FitCheck,
    View,
    advanced,
    counted,
    live_hold,
    merge_changes,
    stamp,
    view_of,
)
from gpupool.controller.observed import Observed
from gpupool.controller.remotepreempt import Preemption
from gpupool.core.allocation import Allocation
from gpupool.core.errors import GpupoolError
from gpupool.core.model import DEFAULT_MEMORY_UNIT_MIB, Node
from gpupool.kube.controller_ops import ControllerApi
from gpupool.kube.errors import AlreadyExists, Conflict, KubeError, NotFound


@dataclass(frozen=True, slots=True)
class Written:
    """The outcome of ``write``: the ledger as written (``view``), else why not."""

    view: View | None
    why: str = ""
    conflict: bool = False  # another writer moved the ledger on first


log = logging.getLogger(__name__)


def _skipped(what: str) -> None:
    """An entry no reader can decode (the CRD's schema keeps them out): left out, said."""
    log.warning("remote preemption: %s (left out)", what)


class RemoteHolds:
    def __init__(self, api: ControllerApi, hold_s: float,
                 memory_unit_mib: int = DEFAULT_MEMORY_UNIT_MIB):
        self.api = api
        self.hold_s = hold_s
        self.memory_unit_mib = memory_unit_mib
        self.fits = FitCheck()

    def read(self) -> dict[str, View]:
        """Every GPULedger by node (``KubeError`` when they cannot be listed)."""
        views = (view_of(obj, warn=_skipped) for obj in self.api.list_ledgers().items)
        return {v.node: v for v in views}

    def fetch(self, node: str) -> View:
        """Node ``node``'s GPULedger (an empty view when there is none)."""
        try:
            return view_of(self.api.get_ledger(node), warn=_skipped)
        except NotFound:
            return View(node)

    @staticmethod
    def holding(views: Mapping[str, View], uid: str, now: float) -> str | None:
        """The node where pod ``uid`` has a live hold or a bind entry, else None."""
        for node, view in sorted(views.items()):
            entry = view.entries.get(uid)
            if entry is not None and (not entry.is_hold or live_hold(entry, now)):
                return node
        return None

    def write(self, p: Preemption, view: View, observed: Observed, now: float,
              bound: Collection[str] = ()) -> Written:
        """Write ``p``'s hold in ``view`` (the serving node's ledger as read) if it fits;
        the holds of pods in ``bound`` (bound to a node: their bind replaced them) count
        nothing and are dropped, as expired ones are."""
        node = _node(observed, p.node)
        if node is None:
            return Written(None, f"node {p.node} publishes no GPUs")
        w = p.preemptor
        alloc = Allocation(w.uid, p.node, 0, 0, p.hold.slices, p.hold.exclusive)
        victims = tuple(v.uid for v in p.victims)
        entry = Entry(alloc, w.pod, stamp(now), w.request.tenant, w.request.gpu_class,
                      w.request.group, HOLD, stamp(now + self.hold_s), victims)
        expired = [u for u, e in view.entries.items()
                   if e.is_hold and u != w.uid and (not live_hold(e, now) or u in bound)]
        gone = set(victims)
        try:
            # the pod's own earlier entry is replaced by this one: neither it nor what it
            # displaced is counted out (its victims still run unless this plan evicts them)
            held = [a for a in counted(view, [*expired, w.uid]) if a.key not in gone]
            self.fits.check(node, held, alloc, self.memory_unit_mib)
        except GpupoolError as exc:
            return Written(None, f"the GPU ledger of {p.node} has no room for it: {exc}")
        changes = merge_changes(view, {w.uid: entry}, expired)
        try:
            if view.resource_version is None:
                obj = {"apiVersion": names.API_VERSION, "kind": "GPULedger",
                       "metadata": {"name": p.node},
                       "spec": {"node": p.node, "entries": {w.uid: changes[w.uid]}}}
                written = advanced(View(p.node), changes, self.api.create_ledger(obj))
            else:
                written = advanced(view, changes, self.api.patch_ledger(
                    p.node, {"spec": {"entries": changes}}, view.resource_version))
        except (Conflict, AlreadyExists, NotFound):
            return Written(None, f"the GPU ledger of {p.node} changed since it was read",
                           conflict=True)
        except KubeError as exc:
            return Written(None, f"writing the GPU ledger of {p.node}: {exc}")
        stored = written.entries.get(w.uid)
        if stored is None or not stored.is_hold:  # a CRD without the hold's fields
            self.remove(written, w.uid)
            return Written(None, "the GPULedger resource cannot store a hold (apply the "
                           "gpuledgers CRD of this version)")
        return Written(written)

    def remove(self, view: View, uid: str) -> bool:
        """Drop ``uid``'s entry from ``view``'s ledger while it is a hold, at ``view``'s
        version, read again once on a conflict; whether it is gone (else it expires)."""
        for attempt in range(2):
            entry = view.entries.get(uid)
            if entry is None or not entry.is_hold:
                return True  # gone, or a bind replaced it meanwhile
            if view.resource_version is None:
                return False
            try:
                self.api.patch_ledger(view.node, {"spec": {"entries": {uid: None}}},
                                      view.resource_version)
                return True
            except (Conflict, NotFound):
                if attempt:
                    return False
                try:
                    view = self.fetch(view.node)
                except KubeError:
                    return False
            except KubeError:
                return False
        return False


def _node(observed: Observed, name: str) -> Node | None:
    """The GPUs ``observed`` publishes on node ``name``, in order (None: none)."""
    gpus = sorted((p.gpu for p in observed.gpus if p.node == name),
                  key=lambda g: (g.index, g.uuid))
    return Node(name, 0, 0, tuple(gpus)) if gpus else None

