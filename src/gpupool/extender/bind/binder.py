"""Bind: re-decide on the chosen node, win the node's GPULedger compare-and-swap, then
create the Binding that carries the signed decision; roll back on any failure.

The caller (``service.Extender``) has checked the pod as the API server has it (it
exists, is pending and unbound, names gpupool's scheduler, has the UID asked) and made
``request`` from it.

1. In the node's turn (``turns``: this replica's binds on one node write its ledger one
   after another), under the cache lock: let go of whatever the pod held before its
   Binding (its assumption, a bind of an earlier attempt, its leftover ledger entries:
   ``Commitments.readopt``), decide among the one node against the freshest state (the
   assumed allocation itself when nothing it rested on changed: ``Holdings.assumed``), hold
   the allocation (``bind``).
2. Check the ledger's entries at the version read plus the new allocation fit the
   node's GPUs, and write the entry with that resourceVersion as a precondition (it
   replaces the pod's own older entry there); a conflict (another replica wrote) decides
   again on the cache's newer version if its watch brought one, else on a fresh read
   (``attempts`` times in all).
3. For each quota scope the pod's charge falls under (a TenantQuota, a cohort, a
   ResourceGroup with a quota, a namespace limit), check the charge against the scope's
   ``QuotaLedger`` and write it there by compare-and-swap (``quotaledger.QuotaGate``);
   a refusal removes what was written, the node's entry included, and answers the
   quota's reason. A pod under no limit skips this step.
4. Sign the decision (``DecisionKeys``) and create one Binding whose annotations are
   the decision and its signature (the API server copies them onto the pod in the same
   write). No Binding is sent once ``BIND_DEADLINE_S`` has passed since the bind began
   (an entry older than that, of a pod still pending, is known to be abandoned:
   ``commitments``). If the Binding fails, the ledger entry and the holds go; if it
   succeeds, entries the pod left on other nodes in earlier attempts are removed (its
   QuotaLedger entries are keyed by pod: each write replaced the earlier one).

A crash at any step leaves at most ledger entries of a pending pod: its next bind
re-uses or replaces it, and it stops holding anything ``PENDING_GRACE_S`` after its
bind time (docs/design/extender.md, "Crash-consistent binds").
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import numpy as np

from gpupool.contract import annotations as records
from gpupool.contract import names
from gpupool.core.allocation import Allocation
from gpupool.core.eligibility import charge_of
from gpupool.core.errors import OverCommit
from gpupool.core.fit import Constraints
from gpupool.core.placement import Placer
from gpupool.core.request import PodRequest, Serving
from gpupool.core.serving import ServingPlacer
from gpupool.extender.bind.ledgerbatch import LedgerBatches
from gpupool.extender.metrics import BindClock, Metrics
from gpupool.extender.state.assumptions import Basis
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.state.ledger import Entry, FitCheck, Ledgers, View
from gpupool.extender.state.signatures import DecisionCheck, DecisionKeys
from gpupool.extender.tenancy.quotaledger import QuotaGate, QuotaLedgers
from gpupool.extender.wire.protocol import BindingArgs
from gpupool.extender.wire.refusals import UNKNOWN_NODE
from gpupool.kube.api import KubeApi
from gpupool.kube.errors import Conflict, KubeError
from gpupool.security.signing import claims_of

log = logging.getLogger(__name__)

BIND_DEADLINE_S = 20.0  # no Binding is sent later than this after the bind began

Step = tuple[Allocation, str | None, View, list[str], Any]


class Binder:
    """Binds pods for one extender; thread-safe (state through the cache lock)."""

    def __init__(self, cache: ClusterCache, kube: KubeApi, metrics: Metrics, attempts: int,
                 clock: Callable[[], float], keys: DecisionKeys):
        self.cache = cache
        self.kube = kube
        self.ledgers = Ledgers(kube)
        self.fits = FitCheck()
        self.metrics = metrics
        self.attempts = attempts
        self.clock = clock
        self.keys = keys
        self.deadline_s = BIND_DEADLINE_S
        self.writes = LedgerBatches(cache, self.ledgers, self.fits, self._read_again)
        self.quotas = QuotaGate(cache, QuotaLedgers(kube), attempts, metrics.conflicts.inc)

    def bind(self, args: BindingArgs, request: PodRequest, placer: Placer,
             rng: random.Random, clock: BindClock | None = None,
             serving: ServingPlacer | None = None) -> str:
        """'' when bound, else why not (the scheduler shows it and retries). ``clock``
        times the stages (``metrics.BIND_STAGES``). ``serving`` places a pod that may have
        its slice served remotely (docs/design/remote.md): its entry goes into the ledger
        of the node whose GPUs serve it, which may not be the node it is bound to."""
        clock = clock or BindClock()
        began = time.monotonic()
        stamp = self.now()  # one bind time, in the ledger entry and on the pod alike
        placed = self._commit(args, request, placer, rng, stamp, clock, serving)
        if isinstance(placed, str):
            return placed
        ledger_node = placed[0].gpu_node  # args.node unless served by another node
        scopes, refused = self.quotas.admit(request.key, self._entry(args, request, *placed,
                                                                     stamp))
        clock.lap("quota")
        if refused:
            self._roll_back(ledger_node, request.key)
            return f"node {args.node}: {refused}"
        notes = self._signed(args, *placed, stamp)
        clock.lap("sign")
        if time.monotonic() - began > self.deadline_s:
            self._roll_back(ledger_node, request.key, scopes)
            return (f"binding {args.namespace}/{args.name} to {args.node} took longer than "
                    f"{self.deadline_s:.0f}s (the API server is slow); the scheduler will retry")
        try:
            self.kube.bind_pod(args.namespace, args.name, args.uid, args.node, notes)
        except KubeError as exc:
            clock.lap("binding")
            self._roll_back_failed(args, request.key, scopes, ledger_node)
            return f"binding {args.namespace}/{args.name} to {args.node} failed: {exc}"
        clock.lap("binding")
        with self.cache.lock:
            self.cache.unhold(request.key, "bind")
        self._remove_superseded(ledger_node, request.key)
        clock.lap("cleanup")
        return ""

    def _signed(self, args: BindingArgs, alloc: Allocation, group: str | None,
                stamp: str) -> dict[str, str]:
        """The decision's annotations with their signature (remembered as valid, so that
        this replica's watch need not verify its own signature again)."""
        notes = records.encode(alloc, stamp, names.PHASE_ALLOCATING)
        if group:
            notes[names.ANNOTATION_RESOURCE_GROUP] = group
        claims = claims_of(args.uid, args.namespace, args.name, notes)
        notes[names.ANNOTATION_SIGNATURE] = signature = self.keys.sign(claims)
        check: DecisionCheck = self.cache.decisions
        check.vouch(claims, signature)
        return notes

    def _remove_superseded(self, node: str, key: str) -> None:
        """Entries of earlier attempts of this pod on other nodes (a crash between a ledger
        write and its Binding): the pod is bound now, so they hold nothing."""
        for other in sorted(self.cache.entry_nodes_of(key) - {node}):
            try:
                self.ledgers.remove(other, key)
            except KubeError as exc:  # stale anyway: the next writer of that ledger prunes it
                log.warning("removing %s from the GPU ledger of %s: %s", key, other, exc)

    def _commit(self, args: BindingArgs, request: PodRequest, placer: Placer,
                rng: random.Random, stamp: str, clock: BindClock,
                serving: ServingPlacer | None = None) -> tuple[Allocation, str | None] | str:
        """Decide on the node and win the ledger's compare-and-swap; or say why not."""
        for _ in range(self.attempts):
            step = self._decide_on(args, request, placer, rng, serving)
            clock.lap("decide")
            if isinstance(step, str):
                return step
            alloc, group, view, _, node = step  # the write prunes (ledgerbatch)
            entry = self._entry(args, request, alloc, group, stamp)
            try:
                new_view = self.writes.commit(view.node, node, request.key, entry,
                                              lambda: clock.lap("node-queue"))
            except (OverCommit, Conflict):
                clock.lap("ledger")
                self.metrics.conflicts.inc()  # the write read the ledger again if need be
                continue
            except KubeError as exc:
                clock.lap("ledger")
                self._roll_back(None, request.key)
                return f"recording the GPUs of {request.key} on {args.node} failed: {exc}"
            self.cache.ledger_update(new_view)
            clock.lap("ledger")
            return alloc, group
        self._roll_back(None, request.key)
        return (f"node {args.node} kept changing under {request.key} "
                f"({self.attempts} attempts); the scheduler will retry")

    def _decide_on(self, args: BindingArgs, request: PodRequest, placer: Placer,
                   rng: random.Random, serving: ServingPlacer | None = None) -> Step | str:
        with self.cache.lock:
            self.cache.flush()
            held = self._gang_hold(request.key, args.node)
            assumed = self.cache.assumed(request, args.node, placer) if held is None else None
            self.cache.readopt(request.key, args.node)
            state = self.cache.state
            i = state.index.get(args.node)
            if i is None:
                return f"node {args.node}: {UNKNOWN_NODE}"
            c = self.cache.modes.constraints(state, request, self.cache.catalogue)
            if serving is not None and request.gpus and request.serving is not Serving.LOCAL:
                served = serving.decide(state, request, args.node, rng, c)
                if served.allocation is None:
                    return served.summary()
                alloc = served.allocation
            else:
                found = self._held_slices(request, held, c)  # a gang member: its own slices
                if found is None and assumed is not None and _still_allowed(c, i, assumed[1]):
                    found = assumed[0]  # what deciding again would give (``assumptions``)
                if found is None:
                    placement = placer.decide(state, request, rng, c,
                                              among=np.array([i], np.int64), explain_limit=1)
                    if placement.allocation is None:
                        return placement.reasons[0].sentence() if placement.reasons else \
                            f"node {args.node}: {request.describe()} does not fit now"
                    found = placement.allocation
                alloc = found
            if not self.cache.hold(alloc, "bind", charge_of(request, alloc, c)):
                return f"node {args.node}: could not reserve {alloc.describe()}"
            serves = alloc.gpu_node  # whose ledger records the slices
            view = self.cache.ledgers.get(serves) or View(serves)
            return alloc, c.group, view, self.cache.prunable(view), \
                state.nodes[state.index[serves]]

    def _gang_hold(self, key: str, node: str) -> Allocation | None:
        """The slices a gang's hold keeps for member ``key`` on ``node`` (under the lock;
        None: it is no gang member, or holds nothing there)."""
        found = self.cache.live_hold(key) if key in self.cache.gangs.gang_of else None
        if found is None or found[0] != node or found[1].allocation.node != node:
            return None
        return found[1].allocation

    def _held_slices(self, request: PodRequest, held: Allocation | None, c: Constraints
                     ) -> Allocation | None:
        """The gang hold's slices with the pod's CPU and memory, held for its bind (None:
        no such hold, it no longer fits, or the pod may not be placed now)."""
        if held is None or c.blocked is not None:
            return None
        alloc = replace(held, cpu_milli=request.cpu_milli, memory_mib=request.memory_mib)
        return alloc if self.cache.hold(alloc, "bind", charge_of(request, alloc, c)) else None

    @staticmethod
    def _entry(args: BindingArgs, request: PodRequest, alloc: Allocation, group: str | None,
               stamp: str) -> Entry:
        return Entry(alloc, f"{args.namespace}/{args.name}", stamp, request.tenant,
                     request.gpu_class, group)

    def _moved_on(self, view: View) -> bool:
        """Whether the cache holds a newer version of ``view``'s ledger (its watch brought
        the write that won), so deciding again needs no read."""
        with self.cache.lock:
            held = self.cache.ledgers.get(view.node)
        ours = view.resource_version or ""
        theirs = (held.resource_version if held is not None else None) or ""
        return ours.isdigit() and theirs.isdigit() and int(theirs) > int(ours)

    def _read_again(self, view: View) -> None:
        """After a lost write from ``view``: a fresh copy of its ledger, unless the cache
        holds a newer one already."""
        if not self._moved_on(view):
            self._refresh_ledger(view.node)

    def _refresh_ledger(self, node: str) -> None:
        try:
            self.cache.ledger_update(self.ledgers.fetch(node))
        except KubeError as exc:
            log.warning("reading the GPU ledger of %s: %s", node, exc)

    def _roll_back_failed(self, args: BindingArgs, key: str, scopes: list[str],
                          ledger_node: str | None = None) -> None:
        """After a failed Binding: if the pod is bound all the same (another bind of it won,
        or the API server applied it and the answer was lost), the entries under its uid
        are the winner's and stay (the node's only when it is bound there); else all go.
        ``ledger_node``: whose ledger this bind wrote (the serving node of a remote slice;
        default the node)."""
        ledger_node = ledger_node or args.node
        bound = self._bound_node(args)
        if bound is None:
            self._roll_back(ledger_node, key, scopes)
            return
        log.info("binding %s/%s to %s failed but the pod is bound to %s: its ledger "
                 "entries are kept", args.namespace, args.name, args.node, bound)
        if bound != args.node:
            self._roll_back(ledger_node, key, [])

    def _bound_node(self, args: BindingArgs) -> str | None:
        """The node the pod with ``args``' uid is bound to (None: not bound, or unknown)."""
        try:
            pod = self.kube.get_pod_json(args.namespace, args.name)
        except KubeError:
            return None
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        node = spec.get("nodeName")
        return str(node) if node and meta.get("uid") == args.uid else None

    def _roll_back(self, node: str | None, key: str, scopes: list[str] | None = None) -> None:
        self.quotas.roll_back(scopes or (), key)
        if node is not None:
            try:
                self.ledgers.remove(node, key)
            except KubeError as exc:  # stale once the pending grace has passed
                log.warning("removing %s from the GPU ledger of %s: %s", key, node, exc)
        with self.cache.lock:
            self.cache.unhold(key, "bind")
            self.cache.unhold(key, "ledger")
            self.cache.restore(key)  # its entries left elsewhere (a preemption's hold)

    def now(self) -> str:
        return datetime.fromtimestamp(self.clock(), UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _still_allowed(c: Constraints, row: int, basis: Basis) -> bool:
    """Whether constraints ``c`` of the bind allow node ``row`` as they did the assumed
    placement: no refusal (a quota may have filled meanwhile), the same GPU mask (by
    identity), the node not masked out."""
    return c.blocked is None and c.gpu_mask is basis.gpu_mask and (
        c.node_mask is None or bool(c.node_mask[row]))
