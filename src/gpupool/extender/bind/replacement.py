"""Remote slices placed again: a slice whose server the controller found lost (or failed)
gets a new decision on another node, as a bind would make it (docs/design/remote.md).

The controller writes ``gpupool.io/slice-status`` ``lost`` or ``failed`` naming the node
the server was on (``controller.slicesplan``); the cache keeps that node for the pod
(``PodFacts.slice_lost``). ``Replacer.sweep`` takes each such pod whose decision still
names that node and:

1. reads the pod as the API server has it and makes its request again, charged to the
   resource group bind recorded (not the pod's label, which its author may change);
2. decides with ``ServingPlacer.decide`` on the pod's own node as home (it is bound and
   stays there), the lost node left out, the pod's current slice and quota charge set
   aside for the decision: the same tiers, policy, classes, groups, permissions and
   quota as at bind, and served by a slice server on every tier (a ``remote-allowed`` pod
   too: its containers started without a device of their own node);
3. writes the new slice's entry into the serving node's GPULedger by compare-and-swap
   (the fit checked against that ledger's entries, as bind does);
4. writes the new decision, signed, on the pod with its resourceVersion as a
   precondition (another replica that placed it first wins: this one's ledger entry goes),
   then removes the old entry from the lost node's ledger and records an Event.

The controller then starts the new server; the sidecar reconnects to the slice's Service
by itself. What was on the old GPU is lost. When nothing has room, the pod keeps its
decision and an Event says why (once per reason); the controller serves it again where
it was after its retry time.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

import numpy as np

from gpupool.contract import annotations as records
from gpupool.contract import names
from gpupool.core.allocation import Allocation
from gpupool.core.errors import GpupoolError, OverCommit
from gpupool.core.fit import Constraints
from gpupool.core.request import PodRequest, Serving
from gpupool.core.serving import ServingPlacer
from gpupool.core.state import ClusterState
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.state.ledger import Entry, FitCheck, Ledgers, View, counted
from gpupool.extender.state.pods import PodFacts
from gpupool.extender.state.signatures import DecisionKeys
from gpupool.extender.wire.podspec import pod_request
from gpupool.kube.api import KubeApi
from gpupool.kube.errors import Conflict, KubeError
from gpupool.security.signing import claims_of

log = logging.getLogger(__name__)

PLACED_AGAIN = "GpupoolSlicePlacedAgain"
NOT_PLACED = "GpupoolSliceNotPlacedAgain"
COMPONENT = "gpupool-extender"


class Replacer:
    """Places lost remote slices again (thread-safe through the cache lock)."""

    def __init__(self, cache: ClusterCache, kube: KubeApi, keys: DecisionKeys,
                 serving: Callable[[], ServingPlacer], rng: random.Random,
                 clock: Callable[[], float] = time.time, attempts: int = 3, host: str = ""):
        self.cache = cache
        self.kube = kube
        self.keys = keys
        self.serving = serving
        self.rng = rng
        self.clock = clock
        self.attempts = attempts
        self.host = host
        self.ledgers = Ledgers(kube)
        self.fits = FitCheck()
        self.told: dict[str, str] = {}  # pod uid -> the last reason it was not placed again

    def sweep(self) -> dict[str, str]:
        """Place again every slice found lost: pod -> the node serving it now, or why not."""
        with self.cache.lock:
            self.cache.flush()
            lost = [f for f in self.cache.pods.values() if f.slice_lost and not f.leaving
                    and f.decision is not None and f.decision.served_by == f.slice_lost]
        return {f"{f.namespace}/{f.name}": self.replace(f) for f in lost}

    def replace(self, f: PodFacts) -> str:
        """The node now serving ``f``'s slice, or why it was not placed again."""
        try:
            pod = self.kube.get_pod_json(f.namespace, f.name)
            meta = pod.get("metadata") or {}
            if meta.get("uid") != f.uid:
                return "the pod is gone"
            # the cache may not have seen a move already made (by this sweep's last round or
            # the other replica): the pod as read now must still be served by the lost node
            now = records.decode(f.uid, meta.get("annotations") or {}).allocation.served_by
            if now != f.slice_lost:
                return f"already served from {now or 'its own node'}"
            # the group bind recorded and signed, never the pod's label now: its author can
            # relabel a bound pod (the webhook is not sent label changes)
            # a running pod's slice stays behind a slice server, even on its own node
            request = replace(pod_request(pod), group=f.group, serving=Serving.REMOTE_REQUIRED)
        except (KubeError, GpupoolError) as exc:
            return f"the pod could not be read again: {exc}"
        version = str(meta.get("resourceVersion") or "")
        for _ in range(self.attempts):
            decided = self._decide(f, request)
            if isinstance(decided, str):
                self._tell(f, NOT_PLACED, f"its slice server on {f.slice_lost} is lost and no "
                                          f"other node can serve its slice now: {decided}", True)
                return decided
            alloc, group = decided
            stamp = datetime.fromtimestamp(self.clock(), UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            entry = Entry(alloc, f"{f.namespace}/{f.name}", stamp, request.tenant,
                          request.gpu_class, group)
            try:
                self._commit(alloc, entry)
            except (OverCommit, Conflict):
                self._refresh(alloc.gpu_node)
                continue
            except KubeError as exc:
                return f"writing the GPU ledger of {alloc.gpu_node} failed: {exc}"
            return self._record(f, alloc, group, stamp, version)
        return f"the GPU ledgers kept changing ({self.attempts} attempts)"

    def _decide(self, f: PodFacts, request: PodRequest) -> tuple[Allocation, str | None] | str:
        """The slice decided again without the lost node (under the cache lock), the pod's
        own slice and charge set aside meanwhile."""
        with self.cache.lock:
            self.cache.flush()
            state = self.cache.state
            if f.node not in state.index:
                return f"node {f.node} is gone"
            charge = self.cache.catalogue.quotas.refund(f.uid)
            held = state.release(f.uid)
            try:
                c = _without(state, self.cache.modes.constraints(state, request,
                                                                 self.cache.catalogue),
                             f.slice_lost)
                served = self.serving().decide(state, request, f.node, self.rng, c)
            finally:
                if held is not None:
                    state.reserve(held)
                if charge is not None:
                    self.cache.catalogue.quotas.charge(f.uid, charge)
            if served.allocation is None:
                return served.summary()
            return served.allocation, c.group

    def _commit(self, alloc: Allocation, entry: Entry) -> None:
        with self.cache.lock:
            node = alloc.gpu_node
            view = self.cache.ledgers.get(node) or View(node)
            prune = self.cache.prunable(view)
            where = self.cache.state.nodes[self.cache.state.index[node]]
            self.fits.check(where, counted(view, prune, replacing=alloc.key), alloc,
                            self.cache.state.memory_unit_mib)
        self.cache.ledger_update(self.ledgers.commit(view, alloc.key, entry, prune))

    def _record(self, f: PodFacts, alloc: Allocation, group: str | None, stamp: str,
                version: str) -> str:
        notes = records.encode(alloc, stamp, names.PHASE_ALLOCATING)
        if group:
            notes[names.ANNOTATION_RESOURCE_GROUP] = group
        claims = claims_of(f.uid, f.namespace, f.name, notes)
        notes[names.ANNOTATION_SIGNATURE] = signature = self.keys.sign(claims)
        patch: dict[str, str | None] = {names.ANNOTATION_RESOURCE_GROUP: None, **notes}
        try:
            self.kube.patch_pod_annotations(f.namespace, f.name, patch, version or None)
        except KubeError as exc:  # another replica placed it first, or the pod changed
            self._forget(alloc.gpu_node, f.uid)
            return f"the pod changed meanwhile ({exc})"
        self.cache.decisions.vouch(claims, signature)
        self._forget(f.slice_lost, f.uid)
        old = f.decision.gpu_node if f.decision is not None else f.slice_lost
        self._tell(f, PLACED_AGAIN, f"its slice server on {old} was lost: its slice is served "
                                    f"from {alloc.gpu_node} now (what was on the GPU is "
                                    "gone)", False)
        log.warning("remote slice of %s/%s placed again: %s -> %s", f.namespace, f.name, old,
                    alloc.gpu_node)
        return alloc.gpu_node

    def _forget(self, node: str, uid: str) -> None:
        try:
            self.ledgers.remove(node, uid)
        except KubeError as exc:  # stale anyway: the next writer of that ledger prunes it
            log.warning("removing %s from the GPU ledger of %s: %s", uid, node, exc)

    def _refresh(self, node: str) -> None:
        try:
            self.cache.ledger_update(self.ledgers.fetch(node))
        except KubeError as exc:
            log.warning("reading the GPU ledger of %s: %s", node, exc)

    def _tell(self, f: PodFacts, reason: str, message: str, warning: bool) -> None:
        if self.told.get(f.uid) == message:
            return
        self.told[f.uid] = message
        try:
            self.kube.create_pod_event(f.namespace, f.name, f.uid, reason, message, warning,
                                       COMPONENT, self.host,
                                       datetime.fromtimestamp(self.clock(), UTC))
        except KubeError as exc:
            log.info("Event %s about pod %s/%s not written: %s", reason, f.namespace, f.name,
                     exc)


def _without(state: ClusterState, c: Constraints, node: str) -> Constraints:
    """``c`` with ``node`` left out of every tier."""
    row = state.index.get(node)
    if row is None:
        return c
    mask = np.ones(len(state.nodes), np.bool_) if c.node_mask is None else c.node_mask.copy()
    mask[row] = False
    return replace(c, node_mask=mask)
