"""Allocate and PreStartContainer: serve the recorded decision, claim it, verify it.

One Allocate (one container, ``n`` logical device IDs):

1. read the node's pods fresh from the API server and kubelet's PodResources;
2. ``handshake.identify`` the pod and container being admitted;
3. take the pod's decision (``gpupool.io/allocation``); without one, decide
   as seed 000 does — the least-loaded GPUs (the core's ``pick_gpus`` with
   ``GpuOrder.LOOSEST``; pod affinity keeps the pod's containers on the same
   GPUs) — and record it first (compare-and-swap);
4. re-check the decision against the node: GPUs present at the recorded
   index, healthy, and room left after the pods that already hold GPUs
   (``ClusterState.reserve``, which raises ``OverCommit``);
5. map the logical IDs onto the decided GPUs (``LogicalPool.assign``);
6. record the claim — ``gpupool.io/devices`` for the container, and phase
   ``allocated`` once every GPU container is served — with the pod's
   resourceVersion as precondition; a conflict restarts from 1.

A refusal names the pod and the reason and, when the pod is known, marks its
phase ``failed`` with that reason. PreStartContainer checks, through
PodResources, that the pod holding the devices is the pod the claim names.
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
from gpupool.core.allocation import Allocation
from gpupool.core.errors import GpupoolError, InvalidInput, OverCommit, UnknownName
from gpupool.core.fit import explain, gpu_fit_mask
from gpupool.core.gpus import build_allocation, pick_gpus
from gpupool.core.request import merged_demand
from gpupool.core.scoring import GpuOrder
from gpupool.kube.errors import Conflict
from gpupool.nodeagent.cluster import PodApi
from gpupool.nodeagent.envs import ContainerAnswer, container_answer
from gpupool.nodeagent.gpu import GpuInfo
from gpupool.nodeagent.handshake import Target, identify
from gpupool.nodeagent.logical import LogicalPool
from gpupool.nodeagent.nodestate import NodeView, gpu_only, held_devices
from gpupool.nodeagent.podresources import Holders, PodResourcesClient
from gpupool.nodeagent.pods import ANNOTATION_DEVICES, Pod

log = logging.getLogger(__name__)
CAS_ATTEMPTS = 8


class Refused(GpupoolError):
    """An Allocate or PreStartContainer the agent will not serve; the message says why."""


class _Reread(Exception):
    """The pod was just written by the agent itself; read it again."""


@dataclass(frozen=True, slots=True)
class AllocatorConfig:
    node: str
    memory_unit_mib: int = 256
    mps_pipe_dir: str = ""


class Allocator:
    """Serves kubelet's Allocate and PreStartContainer for one node (one at a time)."""

    def __init__(self, config: AllocatorConfig, pods: PodApi, kubelet: PodResourcesClient | None,
                 pool: LogicalPool, known_gpus: Callable[[], Sequence[GpuInfo]],
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)):
        self.config = config
        self.pods = pods
        self.kubelet = kubelet
        self.pool = pool
        self.known_gpus = known_gpus
        self.clock = clock
        self.view = NodeView(config.node, config.memory_unit_mib)
        self._lock = threading.Lock()

    # -- Allocate -----------------------------------------------------------------
    def allocate(self, ids: Sequence[str]) -> ContainerAnswer:
        """Serve one container's ``ids``; ``Refused`` says why not.

        The first attempt reads pods from the cache; a conflict, or anything a
        lagging cache could explain, is retried on a fresh list before refusing.
        """
        if not ids:
            raise Refused("kubelet asked to allocate no device")
        with self._lock:
            fresh = False
            for _ in range(CAS_ATTEMPTS):
                try:
                    return self._attempt(list(ids), fresh)
                except (Conflict, _Reread):
                    fresh = True
            raise Refused(f"gave up after {CAS_ATTEMPTS} conflicting writes to the pod")

    def _attempt(self, ids: list[str], fresh: bool) -> ContainerAnswer:
        holders = self._holders()
        fresh = fresh or holders is None
        pods = self.pods.node_pods(self.config.node, fresh)
        try:
            target = identify(pods, holders, len(ids))
        except GpupoolError as exc:
            if not fresh:
                raise _Reread() from None
            raise Refused(str(exc)) from None
        try:
            return self._serve(target, ids, pods, holders)
        except (InvalidInput, OverCommit, UnknownName, Refused) as exc:
            if not fresh:
                raise _Reread() from None
            if target.confirmed:  # a guessed pod (no PodResources) is not marked failed
                self._fail(target.pod, str(exc))
            raise Refused(f"pod {target.pod.ref}: {exc}") from None

    def _serve(self, target: Target, ids: list[str], pods: list[Pod],
               holders: Holders | None) -> ContainerAnswer:
        pod, container = target.pod, target.container
        decision = self._decision(pod, pods)
        alloc = decision.allocation
        slices = [s for s in alloc.slices if s.container == container.name]
        if len(slices) != len(ids):
            raise Refused(f"the decision gives container {container.name} {len(slices)} GPU(s) "
                          f"but kubelet allocates {len(ids)} device(s)")
        self._recheck(pod, alloc, pods)
        busy = {i for held in (holders or {}).values() for c in held.values() for i in c}
        busy |= held_devices(pods, pod.uid)
        mapping = self.pool.assign(ids, [s.gpu_uuid for s in slices], busy)
        self._claim(pod, container.name, mapping)
        return container_answer(pod, container.name, slices, alloc.exclusive, mapping,
                                self.config.mps_pipe_dir)

    def _decision(self, pod: Pod, pods: list[Pod]) -> contract.Decision:
        decision = pod.decision()
        if decision is None:
            return self._decide(pod, pods)
        if decision.phase == names.PHASE_FAILED:
            raise Refused(f"its decision was marked failed: {decision.reason or 'no reason'}")
        if decision.allocation.node != self.config.node:
            raise Refused(f"stale decision: made for node {decision.allocation.node}, "
                          f"the pod is on {self.config.node}")
        return decision

    def _recheck(self, pod: Pod, alloc: Allocation, pods: list[Pod]) -> None:
        state = self.view.state(self.known_gpus(), pods, pod.uid)
        try:
            state.reserve(gpu_only(alloc))
        except (OverCommit, UnknownName) as exc:
            raise Refused(f"stale or inconsistent decision: {exc}") from None

    def _decide(self, pod: Pod, pods: list[Pod]) -> contract.Decision:
        """Seed 000 without an extender: the least-loaded GPUs, recorded before use."""
        state = self.view.state(self.known_gpus(), pods, pod.uid)
        request = pod.request()
        demand = merged_demand(request)
        fit = gpu_fit_mask(state, demand, None)[0]
        if int(fit.sum()) < demand.count:
            reason = explain(state, request, 0)
            raise Refused("no extender decision, and "
                          + (reason.sentence() if reason else "no GPU here has room"))
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
        try:
            self.pods.patch_annotations(pod, contract.phase_patch(names.PHASE_FAILED, reason))
        except GpupoolError as exc:
            log.warning("could not mark pod %s failed: %s", pod.ref, exc)

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
            raise Refused(f"kubelet lists no container holding devices {sorted(wanted)}")
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
            raise Refused(f"pod {ref} holds devices {sorted(wanted)} but is not bound here")
        if set(pod.served().get(container, {})) == wanted:
            return
        served_to = [p.ref for p in pods.values()
                     if any(set(m) == wanted for m in p.served().values())]
        reason = (f"container {container} holds devices {sorted(wanted)} but they were served "
                  f"to {', '.join(served_to) or 'no pod'}: the GPU environment is wrong")
        self._fail(pod, reason)
        raise Refused(f"pod {ref}: {reason}")

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
