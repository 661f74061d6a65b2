"""``Extender``: filter, prioritize and bind, decided by the core on the cache's state.

* filter: ``constraints_for`` (classes, quota, groups) then ``Placer.candidates``
  over every node at once; refused nodes get ``fit.explain``'s sentence through
  ``refusals.Refusals`` (cached per request shape and node version). Permanent reasons go to
  ``FailedAndUnresolvableNodes`` (preemption cannot help), others to
  ``FailedNodes``.
* prioritize: the policy's scores of the sent nodes, scaled to 0..10, the policy's
  choice alone at 10 (``nodenames.decisive``); only hosts with a score above 0 are
  listed (the scheduler adds nothing for a host it does not find, which is what 0
  means). The choice is then assumed taken until the pod's bind comes
  (``state.assumptions``), and so is filter's node when it passes only one.
* bind: ``gate.bindable_request`` — the pod as the API server has it must exist, be
  pending, unbound, of gpupool's scheduler and of the UID asked, and its request is made
  from it — then ``binder.Binder``: ``Placer.decide`` among the one node against the
  freshest state (or the pod's assumed allocation, when nothing it rested on changed:
  ``state.assumptions``), a compare-and-swap on the node's GPULedger, then one Binding
  that also carries the signed decision annotations (docs/design/extender.md).
* remote GPU slices (``core.serving.ServingPlacer``, docs/design/remote.md): a pod whose
  slice may be served by another node passes filter on every node that can be its home
  (``homes``: the reason of the others from ``explain_home``), prioritize ranks those by
  where its slice would be served (own node, then each topology domain, then any), and
  bind decides with the node kube-scheduler chose as home, writing the entry into the
  ledger of the node that serves the slice; a slice whose server the controller found
  lost is placed again elsewhere (``replacement.Replacer``, from the sweep). A
  ``remote-allowed`` pod counts its GPUs as its node's devices (``gpupool.io/gpu``), so
  its homes are the device-plugin nodes with GPUs (``NodeModes.device_homes``); when none
  of the sent nodes can be one, filter answers as for a local pod (and may preempt).
* preempt: keeps the nodes where the proposed victims free enough GPU.
* DRA: a device-plugin pod is refused on a node that serves its GPUs through Dynamic
  Resource Allocation (``dramodes``, also at bind and preemption); a pod whose GPUs come
  from ResourceClaims is scored by ``drascores`` (prioritize, and the
  ``prioritize-claims`` verb); allocated claims are held in the cache (``draclaims``).
* gangs (``gangholds``, docs/gangs.md): filter of a gang member whose gang holds nothing
  yet places the whole gang with the core and holds every member's slices in the
  GPULedgers before it answers; a member passes only on its held node, and bind takes the
  slices held. ``/preempt`` drops the nodes whose proposed victims include a gang member.
* preemption of GPU slices (``preemptor``): when filter finds no node for a GPU pod, the
  extender makes room itself (kube-scheduler's preemption cannot see GPU slices): the core
  picks the victims, the node's GPULedger holds the freed room for the pod, the victims
  are evicted; that node's reason says room is being made, and prioritize ranks the node
  with the pod's hold first.

Filter and prioritize read request bodies as bytes (``filter_json``,
``prioritize_json``: node names are matched to rows and answers rendered without a
Python string per node, see ``nodenames``); ``filter`` and ``prioritize`` take
decoded JSON for callers that hold it. Bind and preempt take decoded JSON. Bad
input comes back as an ``Error``, never as an exception.

What a request body says is used only for that call's answer: translations are
remembered by a digest of the pod's JSON as sent, and prioritize reuses filter's
candidates only for an equal request on an unchanged state. The one exception is the
placement handed to bind, which later calls see as taken (``state.assumptions``): it is
made only for a pod the informer has as pending, unbound and of gpupool's scheduler
(``gate.assumable``), at most one per pod, and it ends when its bind comes or at
``--assume-expiry``. A pending pod's own leftover hold (a
ledger entry of an earlier bind that never completed) is set aside while its filter
and prioritize look at the state (``Commitments.without``).
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec
import numpy as np

from gpupool.contract.gangs import GangRef, gang_ref, pod_group_name
from gpupool.core.allocation import Allocation
from gpupool.core.deviceselectors import environment as selector_environment
from gpupool.core.eligibility import charge_of
from gpupool.core.errors import GpupoolError, InvalidInput
from gpupool.core.fit import Constraints
from gpupool.core.placement import Candidates, Placer, choose
from gpupool.core.policies import make_policy
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.reasons import Check, Reason
from gpupool.core.request import PodRequest, Serving
from gpupool.core.serving import Homes, ServingConfig, ServingPlacer
from gpupool.core.state import ClusterState, IntArray
from gpupool.extender.bind.binder import Binder
from gpupool.extender.bind.gangclaims import GangClaims, GangSettings
from gpupool.extender.bind.gangholds import GangAnswer, GangHolds
from gpupool.extender.bind.gate import DEFAULT_SCHEDULER, assumable, bindable_request
from gpupool.extender.bind.replacement import Replacer
from gpupool.extender.dra.drascores import claim_priorities
from gpupool.extender.metrics import BindClock, Metrics
from gpupool.extender.preemption import proposals
from gpupool.extender.preemption.gangpreempt import GangPreemptor
from gpupool.extender.preemption.plans import PreemptionSettings
from gpupool.extender.preemption.preemptor import Preemptor
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.state.signatures import DecisionKeys
from gpupool.extender.tenancy.quotaholds import GangQuota
from gpupool.extender.tenancy.tenantmetrics import TenancyCollector
from gpupool.extender.wire import protocol
from gpupool.extender.wire.nodenames import MAX_SCORE, Matched, NameTable, decisive, scaled
from gpupool.extender.wire.podspec import pod_request
from gpupool.extender.wire.refusals import Refusals, noted
from gpupool.extender.workload import BUILTIN_WORKLOAD, observed_workload
from gpupool.kube.api import KubeApi

log = logging.getLogger(__name__)

REMEMBERED_REQUESTS = 4096
REMEMBERED_CYCLES = 256


@dataclass(frozen=True, slots=True)
class Settings:
    """What the composition root decides for an extender."""

    policy: str
    weights: dict[str, float] = field(default_factory=dict)
    bind_attempts: int = 5
    seed: int = 0
    scheduler_name: str = DEFAULT_SCHEDULER  # bind acts only on pods naming it
    preemption: PreemptionSettings = field(default_factory=PreemptionSettings)
    serving: ServingConfig = field(default_factory=ServingConfig)  # remote GPU slices
    gangs: GangSettings = field(default_factory=GangSettings)  # gangs' holds and claims


@dataclass(frozen=True, slots=True)
class Cycle:
    """What filter worked out for one pod, reused by prioritize while ``stamp`` holds
    (kube-scheduler's CycleState, kept apart from the long-lived cache)."""

    request: PodRequest
    stamp: tuple[object, ...]
    constraints: Constraints
    candidates: Candidates


class Extender:
    """The extender's decisions; thread-safe (the cache lock serialises state access)."""

    def __init__(self, cache: ClusterCache, settings: Settings, metrics: Metrics,
                 kube: KubeApi | None = None, keys: DecisionKeys | None = None,
                 clock: Callable[[], float] = time.time):
        self.cache = cache
        self.settings = settings
        self.metrics = metrics
        self.kube = kube
        self.clock = clock
        cache.assumptions.count = lambda outcome: metrics.assumptions.labels(outcome).inc()
        if kube is not None and keys is None:
            raise ValueError("an extender that binds needs its decision signing keys")
        self.binder = Binder(cache, kube, metrics, settings.bind_attempts, clock, keys) \
            if kube is not None and keys is not None else None
        self.preemptor = Preemptor(cache, kube, metrics, settings.preemption, clock,
                                   self._decide_on_row) \
            if kube is not None and settings.preemption.enabled else None
        self.refusals = Refusals(metrics)
        self.rng = random.Random(settings.seed)
        self.requests: OrderedDict[str, PodRequest] = OrderedDict()
        self.cycles: OrderedDict[str, Cycle] = OrderedDict()
        self.translated: OrderedDict[bytes, PodRequest] = OrderedDict()
        self._names_of: dict[str, int] | None = None  # the state.index _names is of
        self._names = NameTable([], {})
        self.workload_note = "built-in"
        self.placer = Placer(make_policy(settings.policy, PolicyConfig(BUILTIN_WORKLOAD,
                                                                       settings.weights)))
        self.serving = ServingPlacer(self.placer, settings.serving)
        cache.homes_without_gpus(settings.serving.remote)  # a remote slice's home needs none
        self.replacer = Replacer(cache, kube, keys, lambda: self.serving, self.rng, clock) \
            if kube is not None and keys is not None and settings.serving.remote else None
        self.gangs = GangHolds(cache, self.binder.writes, self.binder.ledgers,
                               GangClaims(self.binder.kube, settings.gangs, clock),
                               settings.gangs, clock, GangQuota(self.binder.quotas),
                               settings.scheduler_name) \
            if self.binder is not None else None
        if self.gangs is not None and self.preemptor is not None:
            self.gangs.room = GangPreemptor(self.preemptor, self.gangs.hold_placed,
                                            self.gangs.drop, self.gangs.unclaim)
        metrics.gpus_allocated.set_function(lambda: self.usage_gpus()[0])
        metrics.gpus_total.set_function(lambda: float(self.usage_gpus()[1]))
        metrics.registry.register(TenancyCollector(cache))

    # -- policy ------------------------------------------------------------------------------
    def refresh_policy(self) -> str:
        """Re-derive the target workload from what the cluster runs; returns where from."""
        with self.cache.lock:
            self.cache.flush()
            workload, note = observed_workload(self.cache.state, list(self.requests.values()))
            self.placer = Placer(make_policy(self.settings.policy,
                                             PolicyConfig(workload, self.settings.weights)))
            self.serving = ServingPlacer(self.placer, self.settings.serving)
            self.workload_note = note
            self.refusals.clear()
        return note

    def warm(self) -> None:
        """Lay out the node-name table of the current layout now (8 ms at 5,000 nodes,
        40 ms at 20,000), and on a cluster with DRA nodes build the CEL environment, so
        that the first calls after start do not pay for them."""
        with self.cache.lock:
            self.cache.flush()
            self._table(self.cache.state)
            dra_nodes = bool(self.cache.dra.slices)
        if dra_nodes:  # build cel-python's parser now (about a second), not in the first
            selector_environment()  # call that reads a claim's selector, under the lock

    def ready(self) -> bool:
        """Every kind a decision reads is listed. TenantQuotas and GPUPermissions count as
        listed when their CRD is absent (``feeds.LENIENT``: none can exist); any other
        failure to list them keeps the replica unready, so that no confined tenant is
        placed while its permissions are unknown."""
        return self.cache.synced >= READY_KINDS

    def close(self) -> None:
        """Stop the preemption worker (after the preemption it is carrying out) and the
        gangs' ledger writers."""
        if self.preemptor is not None:
            self.preemptor.close()
        if self.gangs is not None:
            self.gangs.close()

    def _decide_on_row(self, request: PodRequest, c: Constraints, row: int
                       ) -> Allocation | None:
        """The allocation the policy would give ``request`` on node ``row`` now."""
        placement = self.placer.decide(self.cache.state, request, self.rng, c,
                                       among=np.array([row], np.int64))
        return placement.allocation

    # -- filter -------------------------------------------------------------------------------
    def filter(self, body: Any) -> dict[str, Any]:
        """Filter for decoded JSON; the app sends the request's bytes to ``filter_json``."""
        try:
            args = protocol.parse_args(body)
        except GpupoolError as exc:
            return self._filter_error(exc)
        result: dict[str, Any] = msgspec.json.decode(self._filter(args))
        return result

    def filter_json(self, body: bytes) -> bytes:
        """``ExtenderFilterResult`` JSON for an ``ExtenderArgs`` request body."""
        try:
            args = protocol.read_args(body, "filter")
        except GpupoolError as exc:
            return protocol.encode(self._filter_error(exc))
        return self._filter(args)

    def _filter_error(self, exc: GpupoolError) -> dict[str, Any]:
        self.metrics.decisions.labels("filter", "error").inc()
        return protocol.filter_error(str(exc))

    def _filter(self, args: protocol.ExtenderArgs) -> bytes:
        try:
            request = self._request(args.pod, args.pod_json)
        except GpupoolError as exc:
            return protocol.encode(self._filter_error(exc))
        gang = self.gangs.consider(request.key, self.placer.policy, self.rng,
                                   said_gang(args.pod)) \
            if self.gangs is not None and request.gpus else None
        with self.cache.lock:
            self.cache.flush()
            table = self._table(self.cache.state)
            try:
                sent = _sent(table, args)
            except InvalidInput as exc:
                return protocol.encode(self._filter_error(exc))
            if not request.gpus:
                return protocol.filter_answer(args, args.names_json, None)
            if gang is not None:
                return self._filtered_gang(args, table, sent, gang)
            with self.cache.without(request.key):
                answer, only = self._filtered(args, request, table, sent)
            if only is not None:  # kube-scheduler binds the one node that passes
                self._assume(request, *only)
            return answer

    def _filtered(self, args: protocol.ExtenderArgs, request: PodRequest, table: NameTable,
                  sent: Matched) -> tuple[bytes, tuple[Constraints, Allocation | None] | None]:
        """Filter's answer on the current state, and when one node passes (kube-scheduler
        then binds it without prioritize) the constraints and the allocation there (under
        the cache lock)."""
        state = self.cache.state
        idx = sent.rows
        constraints = self.cache.modes.constraints(state, request, self.cache.catalogue)
        if served_remotely(request):
            remote = self._filtered_remote(args, request, table, sent, constraints)
            if remote is not None:
                return remote, None
            request = replace(request, serving=Serving.LOCAL)  # no home: its own devices
        cands = self.placer.candidates(state, request, constraints)
        if sent.all_known:
            ok = cands.mask[idx]
        else:
            ok = np.zeros(len(idx), np.bool_)
            ok[idx >= 0] = cands.mask[idx[idx >= 0]]
        failed = unresolvable = protocol.NO_NODES
        passing: IntArray | None = None
        if ok.all():
            names_json = args.names_json  # every sent node passed: echo the list
        else:
            failed, unresolvable = self.refusals.of(
                state, request, constraints, self.cache.catalogue_version, sent.names, idx,
                ok)
            if failed == protocol.NO_NODES:  # no sent node can ever take it: not waiting
                self.cache.catalogue.tenants.waiting.forget(request.key)
            passing = np.flatnonzero(ok)
            if not passing.size and self.preemptor is not None:
                rows = [int(i) for i in idx[idx >= 0]]
                notes = self.preemptor.consider(args.pod, request, constraints, rows,
                                                elsewhere=bool(cands.indices.size))
                if notes:
                    failed, unresolvable = noted(failed, unresolvable, notes,
                                                 {state.nodes[i].name for i in rows})
            names_json = self._passing_json(args, table, idx, passing)  # prioritize's
        self._remember(Cycle(request, self._stamp(state), constraints, cands))
        self.metrics.decisions.labels(
            "filter", "fits" if passing is None or passing.size else "unschedulable").inc()
        answer = protocol.filter_answer(args, names_json, passing, failed, unresolvable)
        if int(np.count_nonzero(ok)) != 1 or not self.cache.assumptions.expiry_s:
            return answer, None
        only = int(idx[int(np.flatnonzero(ok)[0])])
        return answer, (constraints, self._decide_on_row(request, constraints, only))

    def _filtered_remote(self, args: protocol.ExtenderArgs, request: PodRequest,
                         table: NameTable, sent: Matched, constraints: Constraints
                         ) -> bytes | None:
        """Filter for a pod whose slice may be served by another node: the nodes that can
        be its home (``ServingPlacer.homes``: its CPU and memory there, its slice there or
        on a node of its domains or anywhere); the others with ``explain_home``'s reason.
        Preemption does not make room for a remote slice: a ``remote-allowed`` pod none of
        the sent nodes can home is filtered as a local pod (None)."""
        state = self.cache.state
        homes = self._homes(state, request, constraints)
        idx = sent.rows
        ok = np.zeros(len(idx), np.bool_)
        ok[idx >= 0] = homes.fits[idx[idx >= 0]]
        if request.serving is Serving.REMOTE_ALLOWED and not ok.any():
            return None
        failed = unresolvable = protocol.NO_NODES
        passing: IntArray | None = None
        names_json = args.names_json
        if not ok.all():
            failed, unresolvable = self.refusals.listed(state, sent.names, idx, ok, lambda i: (
                self._explain_home(state, request, i, constraints, homes)))
            passing = np.flatnonzero(ok)
            names_json = self._passing_json(args, table, idx, passing)
        self.metrics.decisions.labels(
            "filter", "fits" if passing is None or passing.size else "unschedulable").inc()
        return protocol.filter_answer(args, names_json, passing, failed, unresolvable)

    def _filtered_gang(self, args: protocol.ExtenderArgs, table: NameTable, sent: Matched,
                       gang: GangAnswer) -> bytes:
        """A gang member passes only the node its slices are held on; every other node (all
        of them while its gang waits) gets the gang's reason (under the cache lock)."""
        state = self.cache.state
        idx = sent.rows
        row = state.index.get(gang.node, -1) if gang.node else -1
        ok = (idx == row) if row >= 0 else np.zeros(len(idx), np.bool_)
        failed, unresolvable = self.refusals.alike(state, sent.names, idx, ok, gang.why())
        passing = np.flatnonzero(ok)
        self.metrics.decisions.labels(
            "filter", "fits" if passing.size else "unschedulable").inc()
        return protocol.filter_answer(args, self._passing_json(args, table, idx, passing),
                                      passing, failed, unresolvable)

    @staticmethod
    def _passing_json(args: protocol.ExtenderArgs, table: NameTable, idx: IntArray,
                      passing: IntArray) -> bytes:
        """The names of the sent nodes at ``passing`` (node-cache capable; else nothing: a
        NodeList is answered with its node objects), remembered for prioritize."""
        if not args.cache_capable:
            return b""
        names_json = table.names_json(idx[passing])
        table.remember(names_json, idx[passing])
        return names_json

    def sweep_gangs(self) -> list[str]:
        """Let go of the gangs this replica holds that are done or cannot complete
        (``GangHolds.sweep``); the gangs let go."""
        return self.gangs.sweep() if self.gangs is not None else []

    def _stamp(self, state: ClusterState) -> tuple[object, ...]:
        """Changes whenever anything a decision reads changes (versions only grow)."""
        return (state.layout, state.changes, self.cache.catalogue_version)

    def _remember(self, cycle: Cycle) -> None:
        key = cycle.request.key
        self.cycles[key] = cycle
        self.cycles.move_to_end(key)
        while len(self.cycles) > REMEMBERED_CYCLES:
            self.cycles.popitem(last=False)

    def _request(self, pod: Any, pod_json: bytes | None = None) -> PodRequest:
        """The request of the pod a body sends; a pod sent before byte for byte (filter then
        prioritize of one cycle) is not translated again. Remembered by a digest of those
        bytes, never by uid or version alone: another body naming the same uid and
        resourceVersion gets its own translation."""
        digest = hashlib.blake2b(pod_json, digest_size=16).digest() if pod_json else None
        request = self.translated.get(digest) if digest is not None else None
        if request is None:
            request = as_served(pod_request(pod),
                                self.settings.serving.remote and said_gang(pod) is None)
            if digest is not None:
                self.translated[digest] = request
                while len(self.translated) > REMEMBERED_REQUESTS:
                    self.translated.popitem(last=False)
        self.requests[request.key] = request
        self.requests.move_to_end(request.key)
        while len(self.requests) > REMEMBERED_REQUESTS:
            self.requests.popitem(last=False)
        return request

    def _cycle_for(self, state: ClusterState, request: PodRequest, rows: IntArray
                   ) -> tuple[Constraints, Candidates]:
        """(constraints, candidates among ``rows``) — reusing the filter's work for this
        pod when nothing changed since."""
        cycle = self.cycles.get(request.key)
        if cycle is not None and cycle.request == request and cycle.stamp == self._stamp(state):
            c, cands = cycle.constraints, cycle.candidates
        else:
            c = self.cache.modes.constraints(state, request, self.cache.catalogue)
            cands = self.placer.candidates(state, request, c)
        keep = np.zeros(len(state.nodes), np.bool_)
        keep[rows] = True
        return c, cands.among(keep)

    def _table(self, state: ClusterState) -> NameTable:
        """The node names of ``state``'s layout: rows of sent lists, rendered answers."""
        if self._names_of is not state.index:  # a new layout (a new ClusterState starts
            # again at epoch 1, so the epoch alone does not tell layouts apart)
            self._names = NameTable([n.name for n in state.nodes], state.index)
            self._names_of = state.index
        return self._names

    # -- prioritize ------------------------------------------------------------------------------
    def prioritize(self, body: Any) -> protocol.Priorities:
        """Prioritize for decoded JSON; the app sends the request's bytes to
        ``prioritize_json``."""
        try:
            args = protocol.parse_args(body)
        except GpupoolError as exc:
            return protocol.Priorities(self._prioritize_error(exc))
        return protocol.Priorities(self._prioritize(args))

    def prioritize_json(self, body: bytes) -> bytes:
        """``HostPriorityList`` JSON for an ``ExtenderArgs`` request body."""
        try:
            args = protocol.read_args(body, "prioritize")
        except GpupoolError as exc:
            return self._prioritize_error(exc)
        return self._prioritize(args)

    def _prioritize_error(self, exc: GpupoolError) -> bytes:
        self.metrics.decisions.labels("prioritize", "error").inc()
        log.info("prioritize: %s", exc)
        return protocol.NO_PRIORITIES

    def _prioritize(self, args: protocol.ExtenderArgs) -> bytes:
        try:
            request = self._request(args.pod, args.pod_json)
        except GpupoolError as exc:
            return self._prioritize_error(exc)
        if not request.gpus:  # a pod whose GPUs come from ResourceClaims, or none
            return claim_priorities(self, args, request)
        with self.cache.lock:
            self.cache.flush()
            state = self.cache.state
            table = self._table(state)
            try:
                sent = _sent(table, args)
            except InvalidInput as exc:
                return self._prioritize_error(exc)
            rows = sent.rows if sent.all_known else sent.rows[sent.rows >= 0]
            if served_remotely(request):
                with self.cache.without(request.key):
                    answer = self._remote_priorities(state, request, table, rows)
                self.metrics.decisions.labels("prioritize", "scored").inc()
                return answer
            with self.cache.without(request.key):
                c, cands = self._cycle_for(state, request, rows)
                if cands.indices.size == 0:
                    return protocol.NO_PRIORITIES
                scored = self.placer.score(state, request, cands, self.rng)
                k = choose(scored.value, self.rng)  # the node Placer.decide would take
                pick = self.placer.allocate_on(state, request, cands, scored, k) \
                    if self.cache.assumptions.expiry_s else None
            full = np.zeros(len(state.nodes), np.int64)
            full[cands.indices] = scaled(scored.value)
            if not self._favour_hold(request.key, full, cands):
                decisive(full, int(cands.indices[k]))
                self._assume(request, c, pick)
            scores = full[rows]
            positive = scores > 0
            answer = table.priorities_json(rows[positive], scores[positive])
        self.metrics.decisions.labels("prioritize", "scored").inc()
        return answer

    def _remote_priorities(self, state: ClusterState, request: PodRequest, table: NameTable,
                           rows: IntArray) -> bytes:
        """A remote slice's homes ranked by where its slice would be served: its own node
        first (``MAX_SCORE``), then each topology domain in order, then any node; the
        scheduler's other scores order homes of one rank."""
        c = self.cache.modes.constraints(state, request, self.cache.catalogue)
        rank = self._homes(state, request, c).rank[rows]
        step = max(1, MAX_SCORE // (len(self.settings.serving.domains) + 2))
        scores = np.where(rank >= 0, np.maximum(MAX_SCORE - rank * step, 1), 0)
        positive = scores > 0
        return table.priorities_json(rows[positive], scores[positive])

    def _homes(self, state: ClusterState, request: PodRequest, c: Constraints) -> Homes:
        """``ServingPlacer.homes``; a ``remote-allowed`` pod's only on nodes whose devices
        can count its ``gpupool.io/gpu`` (under the cache lock)."""
        homes = self.serving.homes(state, request, c)
        if request.serving is not Serving.REMOTE_ALLOWED:
            return homes
        return Homes(np.where(self.cache.modes.device_homes(state), homes.rank, -1))

    def _explain_home(self, state: ClusterState, request: PodRequest, i: int, c: Constraints,
                      homes: Homes) -> Reason | None:
        if request.serving is Serving.REMOTE_ALLOWED and \
                not self.cache.modes.device_homes(state)[i]:
            return Reason(state.nodes[i].name, Check.REMOTE, ALLOWED_HOME, True)
        return self.serving.explain_home(state, request, i, c, homes)

    def _favour_hold(self, key: str, full: IntArray, cands: Candidates) -> bool:
        """The node where a preemption made room for this pod comes first (the others 0);
        False when the pod has no such node among the candidates."""
        held = self.cache.live_hold(key)
        row = self.cache.state.index.get(held[0]) if held is not None else None
        if row is None or not bool(cands.mask[row]):
            return False
        full[:] = 0
        full[row] = MAX_SCORE
        return True

    def _assume(self, request: PodRequest, c: Constraints, alloc: Allocation | None) -> None:
        """Hold ``alloc``, the placement handed to kube-scheduler's bind, until the bind
        comes (``state.assumptions``; under the lock, after ``without``)."""
        if alloc is not None and assumable(self.cache.unbound.get(request.key), request.key,
                                           self.settings.scheduler_name):
            self.cache.assume(alloc, charge_of(request, alloc, c), self.clock(),
                              (request, self.placer, c.gpu_mask))

    # -- preempt -----------------------------------------------------------------------------------
    def preempt(self, body: Any) -> dict[str, Any]:
        """Keep only the nodes where evicting the proposed victims frees enough GPU for
        the pod and takes no gang member (kube-scheduler chooses victims by its own rules,
        blind to GPU slices).
        ``body``: the request's bytes (``proposals``), or decoded JSON."""
        try:
            args = proposals.read_preemption(body) if isinstance(body, bytes | bytearray) \
                else protocol.parse_preemption(body)
            request = self._request(args.pod)
        except GpupoolError as exc:
            self.metrics.decisions.labels("preempt", "error").inc()
            log.info("preempt: %s", exc)
            return protocol.preemption_result({}, {})
        with self.cache.lock, self.cache.without(request.key):
            self.cache.flush()
            known = self.cache.state.index.keys() & args.victims.keys()  # in one C call
            kept = {node: args.victims[node] for node in sorted(known) if
                    not self._takes_gang_member(args.victims[node]) and
                    proposals.fits_without(self.cache, self.placer, request, node,
                                           args.victims[node])}
        self.metrics.decisions.labels("preempt", "kept" if kept else "none").inc()
        return protocol.preemption_result(kept, args.pdb_violations)

    def _takes_gang_member(self, victims: Sequence[str]) -> bool:
        """Whether kube-scheduler's victims (uids) on a node include a gang member: gpupool
        never agrees to evict part of a gang (docs/gangs.md; under the cache lock)."""
        members = self.cache.gangs.gang_of
        return any(uid in members for uid in victims)

    # -- bind -------------------------------------------------------------------------------------
    def bind(self, body: Any) -> dict[str, str]:
        clock = BindClock(self.metrics.bind_stages)
        try:
            args = protocol.parse_binding(body)
            clock.lap("parse")
            request = self._bind_request(args)
            clock.lap("gate")
        except GpupoolError as exc:
            self.metrics.decisions.labels("bind", "error").inc()
            return protocol.binding_result(str(exc))
        error = self.binder.bind(args, request, self.placer, self.rng, clock, self.serving) \
            if self.binder else "this extender has no Kubernetes API to bind with"
        clock.done()
        self.metrics.decisions.labels("bind", "error" if error else "bound").inc()
        return protocol.binding_result(error)

    def usage_gpus(self) -> tuple[float, int]:
        """(allocated GPU share in whole GPUs, GPUs known) for the metrics scrape."""
        with self.cache.lock:
            self.cache.flush()
            usage = self.cache.state.usage()
        return usage.allocated_milli / 1000, usage.gpus

    def _bind_request(self, args: protocol.BindingArgs) -> PodRequest:
        """The request of the pod as the API server has it (``gate``): the informer's copy
        of a pending pod with this UID, else a fresh read."""
        request = bindable_request(args, self.cache.unbound.get(args.uid), self.kube,
                                   self.settings.scheduler_name)
        with self.cache.lock:
            in_gang = request.key in self.cache.gangs.gang_of
        return as_served(request, self.settings.serving.remote and not in_gang)


def as_served(request: PodRequest, remote: bool) -> PodRequest:
    """``request`` as the extender places it: a ``remote-allowed`` pod is served by its own
    node where remote slices are off (``remote`` False: no provider, or a gang member,
    whose gang's holds are its own node's slices), exactly as a local pod."""
    if request.serving is Serving.REMOTE_ALLOWED and not remote:
        return replace(request, serving=Serving.LOCAL)
    return request


def said_gang(pod: Mapping[str, Any]) -> GangRef | None:
    """The gang a request body's pod says it is in (used only to keep it waiting while
    the informer has not shown the pod yet: a body never places a gang)."""
    meta, spec = pod.get("metadata"), pod.get("spec")
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        return None
    labels = meta.get("labels")
    return gang_ref(str(meta.get("namespace") or "default"),
                    labels if isinstance(labels, Mapping) else None, pod_group_name(spec))


def served_remotely(request: PodRequest) -> bool:
    """Whether ``ServingPlacer`` decides the pod (it asks a slice server: placed remotely
    when remote slices are on, refused with the reason when they are off)."""
    return bool(request.gpus) and request.serving is not Serving.LOCAL


def _sent(table: NameTable, args: protocol.ExtenderArgs) -> Matched:
    """The rows of the nodes ``args`` sends (names decoded already are not parsed again)."""
    return table.match(args.names_json) if args.names is None else \
        table.match_names(args.names)


ALLOWED_HOME = ("remote-allowed: the pod's GPUs are counted as gpupool.io/gpu devices of its "
                "own node, so it runs only on a device-plugin node with GPUs (remote-required "
                "runs on any node)")

READY_KINDS = frozenset({"nodes", "devices", "pods", "ledgers", "tenantquotas",
                         "gpupermissions"})
"""What ``Extender.ready`` waits for (the cache's names of the kinds it has listed)."""
