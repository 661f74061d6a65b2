"""MIG on demand within tenancy: for which waiting pods a GPU is repartitioned, and where.

``serve`` walks the pods that wait for MIG devices, oldest first, over a scratch cluster
state and catalogue (the caller's copies: both are changed), and judges each pod as the
extender will judge it when it places the pod (``eligibility.constraints_for``: resource
class, GPU permissions, TenantQuota and (tenant, class) quota, resource group and its
quota), so that no GPU is repartitioned for a pod that would be refused anyway:

1. a pod that a device it may use can take now is held there (reserved and charged): the
   scheduler will place it, and the pods after it must count neither that device nor
   that quota;
2. a pod its quota refuses now is skipped, with the quota's reason;
3. otherwise the pod is judged on a *probe* of the cluster, where every GPU in MIG mode
   that has the pod's profile offers one more device of it, as the repartition would make
   it (``repartition.device_gpu``: the GPU's labels and node, the profile's memory, held
   by the groups that hold the GPU). A refusal there — quota with the devices counted at
   their memory, a class, permissions that leave no such device, a group — skips the pod.
   Else only the GPUs whose probe device the pod may use, on the nodes the constraints
   allow, are offered to ``repartition.plan``;
4. the plan is made in the scratch state and the pod judged again, as the extender will
   once the devices exist. Refused, or unable to take the new devices, the plan is undone
   and the pod skipped; else the pod is held on its new devices and charged, so that the
   next pods of its tenant see its quota used: of a tenant's pods whose asks together
   exceed its quota, only as many as fit are planned for.

A pod whose refusal does not depend on devices (a quota, an unknown class or group) is
skipped whatever the layouts; a pod for which no GPU it may use can be cut is neither
planned for nor skipped (it waits, as before). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from gpupool.core import mig
from gpupool.core.eligibility import Catalogue, charge_of, constraints_for
from gpupool.core.errors import GpupoolError
from gpupool.core.fit import Constraints, feasible
from gpupool.core.gpus import build_allocation, pick_gpus
from gpupool.core.mig import MigDevice
from gpupool.core.model import Gpu, Node
from gpupool.core.reasons import Check
from gpupool.core.repartition import Allowed, Plan, apply, device_gpu, plan
from gpupool.core.request import PodRequest, merged_demand
from gpupool.core.scoring import GpuOrder
from gpupool.core.state import BoolArray, ClusterState

UNUSABLE = "unusable"
"""The check of a skip whose plan made devices the pod then could not take."""


@dataclass(frozen=True, slots=True)
class Skipped:
    """A waiting pod no GPU is repartitioned for: the refusing check and its sentence."""

    key: str
    check: str  # a ``Check`` value (quota, group, class) or ``UNUSABLE``
    reason: str


@dataclass(frozen=True, slots=True)
class Served:
    """One round: the plans made (in order) and the pods skipped."""

    plans: tuple[Plan, ...]
    skipped: tuple[Skipped, ...]


@dataclass(slots=True)
class _Probe:
    """The cluster with a stand-in device of one profile on each GPU that has it."""

    state: ClusterState
    stand_ins: dict[str, str]  # GPU in MIG mode (uuid) -> its stand-in device's uuid


def serve(state: ClusterState, waiting: Sequence[PodRequest], catalogue: Catalogue,
          weights: dict[str, float] | None = None, allowed: Allowed | None = None,
          limit: int | None = None) -> Served:
    """The plans for ``waiting`` (oldest first) within their tenancy; ``allowed``: the GPUs
    that may be changed at all (e.g. none whose last change is still in flight);
    ``limit``: GPUs changed at most. Each GPU is changed once per call."""
    return _Round(state, catalogue, weights or {}, allowed, limit).serve(waiting)


class _Round:
    def __init__(self, state: ClusterState, catalogue: Catalogue, weights: dict[str, float],
                 allowed: Allowed | None, limit: int | None):
        self.state, self.catalogue, self.weights = state, catalogue, weights
        self.allowed, self.limit = allowed, limit
        self.changed: set[str] = set()
        self.plans: list[Plan] = []
        self.skipped: list[Skipped] = []
        self.generation = 0  # bumped by every change of ``state``: probes are redone
        self.probes: dict[str, tuple[int, _Probe]] = {}

    def serve(self, waiting: Sequence[PodRequest]) -> Served:
        for request in waiting:
            if self.limit is not None and len(self.changed) >= self.limit:
                break
            self._one(request)
        return Served(tuple(self.plans), tuple(self.skipped))

    def _one(self, request: PodRequest) -> None:
        now = constraints_for(self.state, request, self.catalogue)
        if now.blocked is None:
            rows, gpus = feasible(self.state, request, now)
            if rows.any():
                self._hold(request, now, int(np.flatnonzero(rows)[0]), gpus)
                return
        elif now.blocked.check is Check.QUOTA:
            self._skip(request, now.blocked.check.value, now.blocked.message)
            return
        profile = merged_demand(request).mig_profile
        probe = self._probe(profile)
        judged = constraints_for(probe.state, request, self.catalogue)
        if judged.blocked is not None:
            self._skip(request, judged.blocked.check.value, judged.blocked.message)
            return
        usable = None if judged.gpu_mask is None else \
            judged.gpu_mask[:, :self.state.present.shape[1]]  # the probe's first positions
        chosen = plan(self.state, request, Constraints(judged.node_mask, usable),
                      self.weights, self._may_change(probe, judged))
        if chosen is not None:
            self._try(request, chosen)

    def _may_change(self, probe: _Probe, judged: Constraints) -> Allowed:
        """GPUs not changed yet this round, allowed by the caller, whose stand-in device
        the pod may use."""
        mask = judged.gpu_mask

        def may(node: Node, gpu: Gpu) -> bool:
            if gpu.uuid in self.changed or (self.allowed is not None and
                                            not self.allowed(node, gpu)):
                return False
            stand_in = probe.stand_ins.get(gpu.uuid)
            if stand_in is None:
                return False
            return mask is None or bool(mask[probe.state.node_index(node.name),
                                             probe.state.gpu_position(node.name, stand_in)])
        return may

    def _try(self, request: PodRequest, chosen: Plan) -> None:
        """Make ``chosen`` in the scratch state and hold the pod on it, or undo it."""
        i = self.state.node_index(chosen.node)
        before = self.state.nodes[i]
        apply(self.state, chosen, _names_kept(before))
        self.generation += 1
        after = constraints_for(self.state, request, self.catalogue)
        rows, gpus = feasible(self.state, request, after, np.array([i]))
        if after.blocked is None and bool(rows[i]):
            self._hold(request, after, i, gpus)
            self.plans.append(chosen)
            self.changed.update(c.gpu for c in chosen.changes)
            return
        self.state.replace_node(before)
        if after.blocked is not None:
            self._skip(request, after.blocked.check.value, after.blocked.message)
        else:
            self._skip(request, UNUSABLE, f"the MIG devices a repartition on {chosen.node} "
                       "would make are not ones the pod may use")

    def _hold(self, request: PodRequest, constraints: Constraints, i: int,
              gpus: BoolArray | None) -> None:
        """Reserve the pod on node ``i`` and charge it, as its placement will."""
        assert gpus is not None  # a pod asking MIG devices has a GPU verdict
        positions = pick_gpus(self.state, i, merged_demand(request), gpus[i], GpuOrder.TIGHTEST)
        alloc = build_allocation(self.state, request, i, positions)
        self.state.reserve(alloc)
        self.catalogue.quotas.charge(request.key, charge_of(request, alloc, constraints))
        self.generation += 1

    def _skip(self, request: PodRequest, check: str, reason: str) -> None:
        self.skipped.append(Skipped(request.key, check, reason))

    def _probe(self, profile: str) -> _Probe:
        found = self.probes.get(profile)
        if found is None or found[0] != self.generation:
            found = self.probes[profile] = (self.generation, probe_of(self.state, profile))
        return found[1]


def _names_kept(node: Node) -> Callable[[MigDevice], str]:
    """Names for the devices of a plan on ``node``: a device that exists keeps its uuid (so
    the pods holding it stay where they are), a new one gets ``repartition.apply``'s."""
    known = {(g.mig.parent, g.mig.profile, g.mig.start): g.uuid for g in node.gpus
             if isinstance(g.mig, MigDevice)}
    return lambda d: known.get((d.parent, d.profile, d.start)) or \
        f"MIG-{d.parent}-{d.profile}@{d.start}"


def probe_of(state: ClusterState, profile: str) -> _Probe:
    """``state`` with, after the GPUs of each node, one stand-in device of ``profile`` per
    GPU in MIG mode that has the profile: what classes, permissions, groups and quota see
    of the device a repartition would make there. Every allocation is kept (positions are
    unchanged), and so is every GPU's health (a stand-in has its GPU's)."""
    nodes, stand_ins = [], {}
    for node in state.nodes:
        extra = []
        for g in node.gpus:
            geometry = mig.geometry_of(g.model, g.memory_mib) if g.in_mig_mode else None
            if geometry is None or not geometry.has(profile):
                continue
            shape = geometry.profile(profile)
            device = mig.device_at(geometry, g.uuid, profile, shape.starts[0])
            stand_ins[g.uuid] = f"{g.uuid}/{profile}/to-be-made"
            extra.append(device_gpu(g, device, shape.memory_mib, stand_ins[g.uuid]))
        nodes.append(replace(node, gpus=node.gpus + tuple(extra)) if extra else node)
    probe = ClusterState(nodes, state.memory_unit_mib)
    with probe.deferred():
        for alloc in state.allocations.values():
            try:
                probe.reserve(alloc)
            except GpupoolError:
                continue
    for i, j in np.argwhere(state.present & ~state.healthy):
        node = state.nodes[int(i)]
        probe.set_health(node.name, node.gpus[int(j)].uuid, False)
    return _Probe(probe, stand_ins)
