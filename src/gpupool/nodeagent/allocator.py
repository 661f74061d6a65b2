"""Allocate and PreStartContainer: serve the recorded decision, claim it, verify it.

One Allocate (one container, ``n`` logical device IDs):

1. read the node's pods fresh from the API server and kubelet's PodResources;
2. ``handshake.identify`` the pod and container being admitted;
3. refuse a container whose own environment sets variables that control its
   GPUs (``exposure.env_override``); take the pod's decision
   (``gpupool.io/allocation``) only if ``verify.DecisionGate`` accepts it (signed by
   gpupool's scheduler for this pod and node, on a pod that asks a GPU; while the keys
   are not readable yet, it waits a few seconds for them); without a
   decision, refuse — or, with ``decide_unscheduled`` (clusters without the
   extender), decide itself: the least-loaded GPUs (the core's
   ``pick_gpus`` with ``GpuOrder.LOOSEST``; pod affinity keeps the pod's containers
   on the same GPUs), recorded first (compare-and-swap);
4. re-check the decision against the node: GPUs present at the recorded
   index, healthy, and room left after the pods that already hold GPUs
   (``ClusterState.reserve``, which raises ``OverCommit``);
5. map the logical IDs onto the decided GPUs (``LogicalPool.assign``);
6. ask the isolation provider what enforces the slice (``isolation``), then
   record the claim — ``gpupool.io/devices`` for the container, and phase
   ``allocated`` once every GPU container is served — with the pod's
   resourceVersion as precondition; a conflict restarts from 1;
7. answer: the slice described, the GPUs exposed (``exposure``), the
   provider's edits.

A decision served by a slice server (``servedBy``: a ``remote-allowed`` pod whose own
node had no room, served by another node, or by a server beside it on this one) is
answered after step 3 with no device of this node: ``NVIDIA_VISIBLE_DEVICES=void``, no
mount, no CDI device, no isolation (the server enforces the slice), and the provider's
client settings toward the pod's sidecar (``contract.slices.client_env``); kubelet's
logical devices are claimed with no GPU behind them (``nodestate.NO_GPU``), so later
Allocates may trade them between GPUs (``LogicalPool.assign``).

A refusal names the pod and the reason and, when the pod is known, is recorded
(``refusals``: phase ``failed``, ``gpupool.io/reason``, an Event). PreStartContainer
checks, through PodResources, that the pod holding the devices is the pod the
claim names.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from gpupool.contract import annotations as contract
from gpupool.contract import names
from gpupool.core.allocation import Allocation, Slice
from gpupool.core.errors import GpupoolError, InvalidInput, OverCommit, UnknownName
from gpupool.core.fit import explain, gpu_fit_mask
from gpupool.core.gpus import build_allocation, pick_gpus
from gpupool.core.request import merged_demand
from gpupool.core.scoring import GpuOrder
from gpupool.kube.errors import Conflict
from gpupool.nodeagent.cluster import PodApi
from gpupool.nodeagent.envs import ContainerAnswer, ContainerEdits, answer, describe
from gpupool.nodeagent.exposure import Exposure, env_override
from gpupool.nodeagent.gpu import GpuInfo
from gpupool.nodeagent.handshake import Target, identify
from gpupool.nodeagent.isolation.none import NoIsolation
from gpupool.nodeagent.isolation.provider import IsolationProvider, ProviderRefusal, SliceGrant
from gpupool.nodeagent.logical import LogicalPool
from gpupool.nodeagent.nodestate import (
    NO_GPU,
    NodeView,
    floating_devices,
    gpu_only,
    held_devices,
    holds_gpus,
)
from gpupool.nodeagent.podresources import Holders, PodResourcesClient
from gpupool.nodeagent.pods import ANNOTATION_DEVICES, Pod
from gpupool.nodeagent.refusals import RefusalRecorder, Refused
from gpupool.nodeagent.verify import DecisionGate

log = logging.getLogger(__name__)
CAS_ATTEMPTS = 8
SLICE_SERVER = "slice-server"  # GPUPOOL_ISOLATION of a remote slice: its server enforces it
__all__ = ["Allocator", "AllocatorConfig", "Refused"]


class _Reread(Exception):
    """The pod was just written by the agent itself; read it again."""


@dataclass(frozen=True, slots=True)
class AllocatorConfig:
    node: str
    memory_unit_mib: int = 256
    decide_unscheduled: bool = False  # decide for pods without a decision (no extender)
    slice_client: tuple[tuple[str, str], ...] = ()  # a remote slice's client settings
    # (``contract.slices.client_env``); empty: no data-plane provider, remote slices refused


@dataclass(frozen=True, slots=True)
class Safety:
    """What guards an Allocate: the decision gate, the exposure, the isolation provider and
    where refusals are recorded (the defaults: verification off, advisory, nothing kept)."""

    gate: DecisionGate
    exposure: Exposure
    provider: IsolationProvider
    recorder: RefusalRecorder
    isolated: Callable[[], set[str]] = set  # GPUs isolated for over-use: no new slices


class Allocator:
    """Serves kubelet's Allocate and PreStartContainer for one node (one at a time)."""

    def __init__(self, config: AllocatorConfig, pods: PodApi, kubelet: PodResourcesClient | None,
                 pool: LogicalPool, known_gpus: Callable[[], Sequence[GpuInfo]],
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 safety: Safety | None = None):
        self.config = config
        self.pods = pods
        self.kubelet = kubelet
        self.pool = pool
        self.known_gpus = known_gpus
        self.clock = clock
        self.safety = safety or Safety(DecisionGate(config.node, None), Exposure(),
                                       NoIsolation(), RefusalRecorder(pods))
        self.gate = self.safety.gate
        self.view = NodeView(config.node, config.memory_unit_mib)  # given trusted pods only
        self._lock = threading.Lock()

    # -- Allocate -----------------------------------------------------------------
    def allocate(self, ids: Sequence[str]) -> ContainerAnswer:
        """Serve one container's ``ids``; ``Refused`` says why not.

        The first attempt reads pods from the cache; a conflict, or anything a
        lagging cache could explain, is retried on a fresh list before refusing.
        """
        if not ids:
            raise Refused("kubelet asked to allocate no device", "no-devices")
        with self._lock:
            fresh, deadline = False, self.gate.deadline()
            for _ in range(CAS_ATTEMPTS):
                try:
                    return self._attempt(list(ids), fresh, deadline)
                except (Conflict, _Reread):
                    fresh = True
            raise Refused(f"gave up after {CAS_ATTEMPTS} conflicting writes to the pod",
                          "conflict")

    def _attempt(self, ids: list[str], fresh: bool, deadline: float) -> ContainerAnswer:
        holders = self._holders()
        fresh = fresh or holders is None
        pods = self.pods.node_pods(self.config.node, fresh)
        try:
            target = identify(pods, holders, len(ids))
        except GpupoolError as exc:
            if not fresh:
                raise _Reread() from None
            log.warning("Allocate %s: %s", ids, exc)
            self.safety.recorder.count("not-identified")
            raise Refused(str(exc), "not-identified") from None
        try:
            return self._serve(target, ids, pods, holders, deadline)
        except (InvalidInput, OverCommit, UnknownName, Refused, ProviderRefusal) as exc:
            if not fresh:
                raise _Reread() from None
            code = _code(exc)
            if target.confirmed:  # a guessed pod (no PodResources) is not marked failed
                self.safety.recorder.record(target.pod, str(exc), code)
            else:
                self.safety.recorder.count(code)
            raise Refused(f"pod {target.pod.ref}: {exc}", code) from None

    def _serve(self, target: Target, ids: list[str], pods: list[Pod],
               holders: Holders | None, deadline: float) -> ContainerAnswer:
        pod, container = target.pod, target.container
        overriding = env_override(container)
        if overriding:
            raise Refused(overriding, "env-override")
        decision = self._decision(pod, pods, deadline)
        alloc = decision.allocation
        slices = tuple(s for s in alloc.slices if s.container == container.name)
        if len(slices) != len(ids):
            raise Refused(f"the decision gives container {container.name} {len(slices)} GPU(s) "
                          f"but kubelet allocates {len(ids)} device(s)", "count-mismatch")
        if alloc.served_by:
            return self._serve_remote(pod, container.name, alloc, slices, ids)
        holding = self._holding(pods, pod.uid)
        self._recheck(pod, alloc, holding)
        self._not_isolated(pod, slices)
        busy = {i for held in (holders or {}).values() for c in held.values() for i in c}
        busy |= held_devices(holding, pod.uid)
        grant = SliceGrant(pod.uid, pod.ref, container.name, slices, alloc.exclusive)
        provided = self.safety.provider.edits(grant)
        mapping = self.pool.assign(ids, [s.gpu_uuid for s in slices], busy,
                                   floating_devices(holding, pod.uid))
        self._claim(pod, container.name, mapping)
        log.info("Allocate: pod %s container %s gets %s (%s, %s), devices %s", pod.ref,
                 container.name, ", ".join(f"{s.gpu_uuid}[{s.memory_mib} MiB, {s.core_pct} %]"
                                           for s in slices),
                 "exclusive" if alloc.exclusive else "shared",
                 f"isolation {self.safety.provider.name}", sorted(mapping))
        provider = str(self.safety.provider.name)
        return answer(describe(pod, container.name, slices, alloc.exclusive, mapping, provider),
                      self.safety.exposure.edits([s.gpu_uuid for s in slices]), provided)

    def _serve_remote(self, pod: Pod, container: str, alloc: Allocation,
                      slices: Sequence[Slice], ids: list[str]) -> ContainerAnswer:
        """A slice a slice server serves: no device of this node, the client's settings."""
        if not self.config.slice_client:
            raise Refused(f"its GPUs are served by a slice server on {alloc.served_by} (a "
                          "remote slice) and this node agent has no data-plane provider "
                          "(--remote-provider)", "remote-slice")
        mapping = dict.fromkeys(ids, NO_GPU)
        self._claim(pod, container, mapping)
        log.info("Allocate: pod %s container %s: its slice of %s is served by a slice server "
                 "on %s; devices %s carry no GPU of this node", pod.ref, container,
                 ", ".join(s.gpu_uuid for s in slices), alloc.served_by, sorted(mapping))
        where = ContainerEdits({"GPUPOOL_SLICE_SERVED_BY": alloc.served_by,
                                **dict(self.config.slice_client)})
        return answer(describe(pod, container, slices, alloc.exclusive, mapping,
                               SLICE_SERVER), where)

    def _not_isolated(self, pod: Pod, slices: Sequence[Slice]) -> None:
        isolated = self.safety.isolated() & {s.gpu_uuid for s in slices}
        if isolated and not pod.served():
            raise Refused(f"GPU {', '.join(sorted(isolated))} is isolated (a container there "
                          "uses more than its slice) and takes no new slices", "gpu-isolated")

    def _decision(self, pod: Pod, pods: list[Pod], deadline: float) -> contract.Decision:
        verdict = self.gate.settled(pod, deadline)
        if not verdict.ok:
            raise Refused(verdict.reason, verdict.code)
        decision = pod.decision()
        if decision is None:
            if self.config.decide_unscheduled:
                return self._decide(pod, pods)
            raise Refused("it carries no gpupool decision (it was not scheduled by "
                          "gpupool-scheduler); schedule it with schedulerName "
                          "gpupool-scheduler", "no-decision")
        if decision.phase == names.PHASE_FAILED:
            raise Refused(f"its decision was marked failed: {decision.reason or 'no reason'}",
                          "failed-before")
        if decision.allocation.node != self.config.node:
            raise Refused(f"stale decision: made for node {decision.allocation.node}, "
                          f"the pod is on {self.config.node}", "other-node")
        return decision

    def _holding(self, pods: list[Pod], skip_uid: str) -> list[Pod]:
        """The other pods that hold GPUs by a decision that verifies (checked once here)."""
        return [p for p in pods if p.uid != skip_uid and holds_gpus(p) and self.gate.trusted(p)]

    def _recheck(self, pod: Pod, alloc: Allocation, pods: list[Pod]) -> None:
        state = self.view.state(self.known_gpus(), pods, pod.uid)
        try:
            state.reserve(gpu_only(alloc))
        except (OverCommit, UnknownName) as exc:
            raise Refused(f"stale or inconsistent decision: {exc}", "stale") from None

    def _decide(self, pod: Pod, pods: list[Pod]) -> contract.Decision:
        """Logical devices with no extender: the least-loaded GPUs, recorded before use."""
        state = self.view.state(self.known_gpus(), self._holding(pods, pod.uid), pod.uid)
        request = pod.request()
        demand = merged_demand(request)
        fit = gpu_fit_mask(state, demand, None)[0]
        if int(fit.sum()) < demand.count:
            reason = explain(state, request, 0)
            raise Refused("no extender decision, and "
                          + (reason.sentence() if reason else "no GPU here has room"),
                          "no-room")
        positions = pick_gpus(state, 0, demand, fit, GpuOrder.LOOSEST)
        alloc = build_allocation(state, request, 0, positions)
        bind_time = self.clock().strftime("%Y-%m-%dT%H:%M:%SZ")
        self.pods.patch_annotations(pod, contract.encode(alloc, bind_time))
        raise _Reread()

    def _claim(self, pod: Pod, container: str, mapping: dict[str, str]) -> None:
        served = {**pod.served(), container: mapping}
        patch = {ANNOTATION_DEVICES: json.dumps(served, sort_keys=True, separators=(",", ":"))}
        if all(c.name in served for c in pod.containers):
            patch.update(contract.phase_patch(names.PHASE_ALLOCATED))
        self.pods.patch_annotations(pod, patch)

    def _fail(self, pod: Pod, reason: str) -> None:
        self.safety.recorder.record(pod, reason, "prestart-mismatch")

    def _holders(self) -> Holders | None:
        return self.kubelet.holders() if self.kubelet is not None else None

    # -- PreStartContainer ----------------------------------------------------------
    def verify(self, ids: Sequence[str]) -> None:
        """Check that the pod kubelet gave ``ids`` is the pod the agent served them to."""
        holders = self._holders()
        if holders is None:
            log.warning("PodResources unavailable: cannot verify devices %s", list(ids))
            return
        wanted = set(ids)
        owner = next(((ref, c) for ref, held in holders.items() for c, got in held.items()
                      if set(got) == wanted), None)
        if owner is None:
            raise Refused(f"kubelet lists no container holding devices {sorted(wanted)}",
                          "prestart-mismatch")
        ref, container = owner
        cached = {p.ref: p for p in self.pods.node_pods(self.config.node, fresh=False)}
        pod = cached.get(ref)
        if pod is not None and set(pod.served().get(container, {})) == wanted:
            return
        pods = {p.ref: p for p in self.pods.node_pods(self.config.node, fresh=True)}
        self._check_claim(pods, ref, container, wanted)

    def _check_claim(self, pods: dict[str, Pod], ref: str, container: str,
                     wanted: set[str]) -> None:
        pod = pods.get(ref)
        if pod is None:
            raise Refused(f"pod {ref} holds devices {sorted(wanted)} but is not bound here",
                          "prestart-mismatch")
        if set(pod.served().get(container, {})) == wanted:
            return
        served_to = [p.ref for p in pods.values()
                     if any(set(m) == wanted for m in p.served().values())]
        reason = (f"container {container} holds devices {sorted(wanted)} but they were served "
                  f"to {', '.join(served_to) or 'no pod'}: the GPU environment is wrong")
        self._fail(pod, reason)
        raise Refused(f"pod {ref}: {reason}", "prestart-mismatch")

    # -- GetPreferredAllocation ---------------------------------------------------------
    def preferred(self, available: Sequence[str], must: Sequence[str], size: int) -> list[str]:
        """``size`` devices: ``must`` first, then spread over GPUs, the least-loaded first."""
        known = set(self.pool.owners())
        owners = {i: self.pool.owner(i) for i in available if i in known}
        free = Counter(owners.values())
        chosen = [i for i in dict.fromkeys(must) if i in owners][:size]
        used = Counter(owners[i] for i in chosen)
        rest = sorted(set(owners) - set(chosen))
        while len(chosen) < size and rest:
            best = min(rest, key=lambda i: (used[owners[i]], -free[owners[i]], i))
            chosen.append(best)
            used[owners[best]] += 1
            rest.remove(best)
        return chosen


def _code(exc: Exception) -> str:
    if isinstance(exc, Refused | ProviderRefusal):
        return exc.code
    if isinstance(exc, OverCommit):
        return "no-free-device"
    if isinstance(exc, UnknownName):
        return "stale"
    return "unreadable"
