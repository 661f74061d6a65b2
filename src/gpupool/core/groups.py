"""Tenant resource groups: sets of nodes and GPUs bound to tenants.

A ``ResourceGroup`` holds whole nodes (every GPU on them) and/or single GPUs by
uuid, so a group can take part of a machine and two groups may share GPUs. It
names the tenants allowed to draw from it (none named: everyone) and the GPU
models it is meant for (none named: any; otherwise only member GPUs of those
models count). Groups are built by hand or by ``groupplan.build_groups`` from GPU
model and an estimated demand per tenant, and updated with ``ResourceGroup.updated``.

A pod names its group, or — when it names none and groups exist — the group is
chosen by best fit (``GroupCatalog.choose``): among the groups the tenant may
use in which the pod fits now, the one whose remaining capacity is closest
above the demand, so big groups stay whole for big pods.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

import numpy as np

from gpupool.core.books import MaskCache, NamedBook
from gpupool.core.errors import InvalidInput
from gpupool.core.fit import Constraints, demand_of, gpu_fit_mask, need_milli
from gpupool.core.mig import MigDevice
from gpupool.core.model import Gpu
from gpupool.core.quota import Charge, QuotaBook
from gpupool.core.request import PodRequest
from gpupool.core.state import BoolArray, ClusterState, IntArray

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")
MILLI = 1000


@dataclass(frozen=True, slots=True)
class ResourceGroup:
    """Members (node names, GPU uuids), allowed tenants and intended GPU models.

    Any iterable is accepted for the sets; they are stored as frozensets.
    """

    name: str
    nodes: frozenset[str] = frozenset()
    gpus: frozenset[str] = frozenset()
    tenants: frozenset[str] = frozenset()
    models: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise InvalidInput(f"group name {self.name!r} must be 1-63 lower-case letters, "
                               "digits, '-' or '.', starting and ending with a letter or digit")
        for field_name in ("nodes", "gpus", "tenants", "models"):
            value = getattr(self, field_name)
            if isinstance(value, str):
                raise InvalidInput(f"group {self.name}: {field_name} must be a set of names, "
                                   f"not the string {value!r}")
            members = frozenset(value)
            if any(not isinstance(m, str) or not m for m in members):
                raise InvalidInput(f"group {self.name}: {field_name} holds an empty name")
            object.__setattr__(self, field_name, members)

    def allows(self, tenant: str | None) -> bool:
        """May ``tenant`` draw from this group? (An open group allows everyone.)"""
        return not self.tenants or tenant in self.tenants

    def suits(self, models: frozenset[str] | None) -> bool:
        """Can a pod allowing ``models`` (None: any) use this group's GPUs?"""
        return not self.models or models is None or bool(self.models & models)

    def holds(self, node: str, gpu: Gpu) -> bool:
        """Is ``gpu`` (on ``node``) a member GPU of this group?"""
        if self.models and gpu.model not in self.models:
            return False
        parent = gpu.mig.parent if isinstance(gpu.mig, MigDevice) else ""
        return node in self.nodes or gpu.uuid in self.gpus or parent in self.gpus

    def updated(
        self,
        *,
        add_nodes: Iterable[str] = (),
        remove_nodes: Iterable[str] = (),
        add_gpus: Iterable[str] = (),
        remove_gpus: Iterable[str] = (),
        tenants: Iterable[str] | None = None,
        models: Iterable[str] | None = None,
    ) -> ResourceGroup:
        """A copy with members added or removed, and tenants or models replaced."""
        return replace(
            self,
            nodes=(self.nodes | frozenset(add_nodes)) - frozenset(remove_nodes),
            gpus=(self.gpus | frozenset(add_gpus)) - frozenset(remove_gpus),
            tenants=self.tenants if tenants is None else frozenset(tenants),
            models=self.models if models is None else frozenset(models),
        )

    def describe(self) -> str:
        who = ", ".join(sorted(self.tenants)) or "everyone"
        models = ", ".join(sorted(self.models)) or "any model"
        return (f"group {self.name}: {len(self.nodes)} nodes + {len(self.gpus)} GPUs, "
                f"for {who}, {models}")


@dataclass(frozen=True, slots=True)
class GpuLayout:
    """Where each GPU sits in a state's arrays, and its model, for one epoch."""

    position: dict[str, tuple[int, int]]  # uuid -> (node index, GPU position)
    model_id: IntArray  # [node, gpu] -> index into ``models`` (-1: no GPU there)
    models: dict[str, int]
    mig_devices: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    """A GPU in MIG mode's uuid -> where its MIG devices are (a member GPU's MIG devices
    are members too)."""

    @staticmethod
    def of(state: ClusterState) -> GpuLayout:
        position: dict[str, tuple[int, int]] = {}
        models: dict[str, int] = {}
        devices: dict[str, list[tuple[int, int]]] = {}
        model_id = np.full(state.present.shape, -1, np.int64)
        for i, node in enumerate(state.nodes):
            for j, gpu in enumerate(node.gpus):
                position[gpu.uuid] = (i, j)
                model_id[i, j] = models.setdefault(gpu.model, len(models))
                if isinstance(gpu.mig, MigDevice):
                    devices.setdefault(gpu.mig.parent, []).append((i, j))
        return GpuLayout(position, model_id, models, devices)


def group_gpu_mask(state: ClusterState, group: ResourceGroup,
                   layout: GpuLayout | None = None) -> BoolArray:
    """[node, gpu] -> the GPU is a member of ``group`` (present GPUs only).

    Costs O(members) given the epoch's ``layout`` (built here when not given).
    """
    layout = layout or GpuLayout.of(state)
    mask = np.zeros(state.present.shape, np.bool_)
    rows = [state.index[n] for n in group.nodes if n in state.index]
    mask[rows] = state.present[rows]
    cells = [layout.position[u] for u in group.gpus if u in layout.position]
    cells += [c for u in group.gpus for c in layout.mig_devices.get(u, ())]
    if cells:
        mask[tuple(np.array(cells).T)] = True
    if group.models:
        ids = [layout.models[m] for m in group.models if m in layout.models]
        mask &= np.isin(layout.model_id, ids)
    return mask


# -- best-fit choice ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupRoom:
    """How a pod stands in one group now: free and total share (milli-GPU) of the
    member GPUs it may use, what it needs, and whether some member node fits it."""

    group: ResourceGroup
    free_milli: int
    capacity_milli: int
    demand_milli: int
    fits: bool
    refusal: str = ""  # why it cannot be chosen ('' when it can)
    permanent: bool = False  # the refusal holds however the group's load changes


@dataclass(frozen=True, slots=True)
class _Probe:
    """What one request needs, over the whole cluster, computed once per choice."""

    node_ok: BoolArray  # [node] CPU, memory and GPU model fit (GPUs aside)
    allowed: BoolArray  # [node, gpu] GPUs the pod may use: its models, its class
    gpu_fit: BoolArray | None  # [node, gpu] can take one slice now (class mask applied)
    free: IntArray  # [node, gpu] free share of healthy GPUs, 0 elsewhere
    need: IntArray  # [node, gpu] share one slice takes there

    @staticmethod
    def of(state: ClusterState, request: PodRequest, gpu_mask: BoolArray | None) -> _Probe:
        models = state.model_mask(request.models)
        node_ok = models & (state.cpu_free >= request.cpu_milli) & (
            state.mem_free >= request.memory_mib)
        allowed = models[:, None] & (state.present if gpu_mask is None else gpu_mask)
        demand = demand_of(request)
        fit = None if demand is None else gpu_fit_mask(state, demand, gpu_mask)
        free = np.where(state.present & state.healthy, np.maximum(state.free_milli, 0), 0)
        need = (np.zeros(state.present.shape, np.int64) if demand is None
                else need_milli(state, demand))
        return _Probe(node_ok, allowed, fit, free, need)


@dataclass(frozen=True, slots=True)
class GroupChoice:
    """The chosen group (None if none fits) and how every candidate stood."""

    group: ResourceGroup | None
    rooms: tuple[GroupRoom, ...]

    def refusals(self) -> list[str]:
        return [r.refusal for r in self.rooms if r.refusal]


class GroupCatalog(NamedBook[ResourceGroup, BoolArray]):
    """The known groups by name, with their masks cached per cluster epoch."""

    noun = "resource group"

    def __init__(self, groups: Iterable[ResourceGroup] = ()):
        self._layouts: MaskCache[GpuLayout] = MaskCache()
        super().__init__(groups)

    def __iter__(self) -> Iterator[ResourceGroup]:
        return iter([self._items[n] for n in sorted(self._items)])

    def usable_by(self, tenant: str | None) -> list[ResourceGroup]:
        """The groups ``tenant`` may draw from, by name."""
        return [g for g in self if g.allows(tenant)]

    def gpu_mask(self, state: ClusterState, name: str) -> BoolArray:
        """Member GPUs of group ``name`` [node, gpu]; cached per epoch, read-only."""
        masks = self._cache.masks_for(state)
        mask = masks.get(("gpu", name))
        if mask is None:
            mask = masks["gpu", name] = group_gpu_mask(state, self.get(name), self.layout(state))
            mask.flags.writeable = False
        return mask

    def layout(self, state: ClusterState) -> GpuLayout:
        """The GPU positions of ``state`` at its current epoch (cached)."""
        table = self._layouts.masks_for(state)
        found = table.get("layout")
        if found is None:
            found = table["layout"] = GpuLayout.of(state)
        return found

    def node_mask(self, state: ClusterState, name: str) -> BoolArray:
        """Member nodes: named nodes and nodes holding a member GPU; cached, read-only."""
        masks = self._cache.masks_for(state)
        mask = masks.get(("node", name))
        if mask is None:
            group = self.get(name)
            named = np.zeros(len(state.nodes), np.bool_)
            named[[state.index[n] for n in group.nodes if n in state.index]] = True
            mask = masks["node", name] = named | self.gpu_mask(state, name).any(axis=1)
            mask.flags.writeable = False
        return mask

    def constraints(self, state: ClusterState, name: str, gpu_mask: BoolArray | None
                    ) -> Constraints:
        """The group's masks, narrowed by ``gpu_mask`` (a class or selector) if given."""
        return Constraints(self.node_mask(state, name), self._narrowed(state, name, gpu_mask),
                           None, group=name)

    def _narrowed(self, state: ClusterState, name: str, gpu_mask: BoolArray | None
                  ) -> BoolArray:
        """The group's GPUs within ``gpu_mask``, one read-only object per pair and epoch
        (scorers key their caches on the mask's identity). ``gpu_mask`` comes from the
        class catalogue's cache; it is held here, so its ``id`` stays its own."""
        gmask = self.gpu_mask(state, name)
        if gpu_mask is None:
            return gmask
        return self._intersect(state, name, gmask, gpu_mask)

    def room(self, state: ClusterState, request: PodRequest, group: ResourceGroup,
             gpu_mask: BoolArray | None = None) -> GroupRoom:
        """Where ``request`` stands in ``group`` now (GPU models and ``gpu_mask`` honoured)."""
        return self._room(state, request, group, _Probe.of(state, request, gpu_mask))

    def _room(self, state: ClusterState, request: PodRequest, group: ResourceGroup,
              probe: _Probe) -> GroupRoom:
        members = self.gpu_mask(state, group.name)
        usable = members & probe.allowed
        capacity = int(usable.sum()) * MILLI
        free = int(probe.free[usable].sum())
        demand = demand_of(request)
        need, fits = 0, bool((probe.node_ok & self.node_mask(state, group.name)).any())
        if demand is not None and probe.gpu_fit is not None:
            per_gpu = probe.need[usable]
            need = demand.count * (int(per_gpu.min()) if per_gpu.size else MILLI)
            room_on = (probe.gpu_fit & members).sum(axis=1) >= demand.count
            fits = bool((probe.node_ok & self.node_mask(state, group.name) & room_on).any())
        refusal = "" if fits else (
            f"group {group.name}: {_gpus(free)} of {_gpus(capacity)} GPUs free, no member node "
            f"can take {request.describe()}")
        too_small = demand is not None and capacity < demand.count * MILLI
        return GroupRoom(group, free, capacity, need, fits, refusal, too_small and not fits)

    def choose(self, state: ClusterState, request: PodRequest, gpu_mask: BoolArray | None = None,
               quotas: QuotaBook | None = None, charge: Charge | None = None) -> GroupChoice:
        """Best fit among the groups the tenant may use whose GPU models suit the pod:
        of those where it fits now (and, given ``quotas`` and ``charge``, whose group
        quota allows it), the one with the least free capacity left above the demand.
        Ties go to the smaller group, then the name."""
        probe = _Probe.of(state, request, gpu_mask)
        rooms = [self._room_or_refusal(state, request, g, probe, quotas, charge)
                 for g in self.usable_by(request.tenant)]
        fitting = [r for r in rooms if not r.refusal]
        if not fitting:
            return GroupChoice(None, tuple(rooms))
        best = min(fitting, key=lambda r: (r.free_milli - r.demand_milli, r.capacity_milli,
                                           r.group.name))
        return GroupChoice(best.group, tuple(rooms))

    def _room_or_refusal(self, state: ClusterState, request: PodRequest, group: ResourceGroup,
                         probe: _Probe, quotas: QuotaBook | None,
                         charge: Charge | None) -> GroupRoom:
        if not group.suits(request.models):
            models = ", ".join(sorted(group.models))
            allowed = ", ".join(sorted(request.models or ()))
            return GroupRoom(group, 0, 0, 0, False,
                             f"group {group.name} is meant for {models}, the pod allows {allowed}",
                             True)
        if quotas is not None and charge is not None:
            reason = quotas.check(Charge(charge.amount, group=group.name))
            if reason is not None:
                return GroupRoom(group, 0, 0, 0, False, reason.message, reason.permanent)
        return self._room(state, request, group, probe)


def _gpus(milli: int) -> str:
    return f"{milli / MILLI:g}"
