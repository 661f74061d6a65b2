"""Resource group members: automatic groups planned, every group's members, capacity, free
GPUs and conflicts written to its status.

Each round the controller turns the observed GPUs (with their nodes' labels) into core
nodes, reads the GPUPermissions, and asks ``core.groupplan.plan_automatic`` for the members
of every ``spec.mode: automatic`` group, starting from the members its status holds (so a
plan is stable while nothing changed, and GPUs holding running pods stay where they are).
Manual groups keep the members their spec names. Every group's ``status`` then gets

* ``members``: ``{gpus: [uuids], nodes: [names]}``;
* ``capacity`` and ``free``: member GPUs, and those of them no pod holds anything of;
* ``conflicts``: each GPU it shares with a group where the two may not share (both must
  say ``spec.shareable: true``);
* ``unmet`` (automatic groups): GPUs short of the demand.

Pure (``plan``): the loop supplies the observed world, node labels and permissions, and
applies the returned status patches. ``reconcile.group_status`` keeps these keys as they
are (``PLANNED_KEYS``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpupool.contract.tenancy import Broken, automatic_of, group_of, is_automatic, planned_members
from gpupool.controller.observed import Obj, Observed, name_of
from gpupool.controller.status import merge_diff
from gpupool.core.groupplan import AutoGroup, Claim, plan_automatic
from gpupool.core.model import Gpu, Labels, Node
from gpupool.core.tenants import PermissionBook

PLANNED_KEYS = ("members", "capacity", "free", "conflicts", "unmet")


@dataclass(frozen=True, slots=True)
class MemberPatch:
    """A status patch for one ResourceGroup (merge patch: None deletes a key)."""

    name: str
    patch: Obj


def core_nodes(observed: Observed, labels: Mapping[str, Labels]) -> list[Node]:
    """The observed GPUs as core nodes (by name, GPUs by index) with their nodes' labels;
    CPU and memory play no part in planning."""
    by_node: dict[str, dict[str, Gpu]] = {}
    for placed in observed.gpus:
        by_node.setdefault(placed.node, {}).setdefault(placed.gpu.uuid, placed.gpu)
    out = []
    for name in sorted(by_node):
        gpus = tuple(sorted(by_node[name].values(), key=lambda g: (g.index, g.uuid)))
        out.append(Node(name, 0, 0, gpus, labels.get(name, ())))
    return out


def plan(observed: Observed, labels: Mapping[str, Labels], permissions: PermissionBook
         ) -> list[MemberPatch]:
    """The status patches that bring every group's planned keys in line."""
    nodes = core_nodes(observed, labels)
    busy = frozenset(u for h in observed.holdings for u in h.allocation.gpu_uuids)
    autos, fixed, current = _read(observed.groups, nodes)
    result = plan_automatic(nodes, autos, fixed, current, busy,
                            lambda t: permissions.permitted(nodes, t))
    members = {c.group: c.gpus for c in fixed} | result.members
    where = {g.uuid: n.name for n in nodes for g in n.gpus}
    patches = []
    for obj in sorted(observed.groups, key=name_of):
        name = name_of(obj)
        if name not in members:
            continue
        desired = _status(members[name], where, busy, result.conflicts.get(name, ()),
                          result.unmet.get(name, 0) if is_automatic(obj) else None)
        have = {k: v for k, v in (obj.get("status") or {}).items() if k in PLANNED_KEYS}
        patch = merge_diff(have, desired)
        if patch:
            patches.append(MemberPatch(name, patch))
    return patches


def _read(groups: Iterable[Obj], nodes: list[Node]
          ) -> tuple[list[AutoGroup], list[Claim], dict[str, frozenset[str]]]:
    autos: list[AutoGroup] = []
    fixed: list[Claim] = []
    current: dict[str, frozenset[str]] = {}
    for obj in groups:
        name = name_of(obj)
        spec = obj.get("spec")
        shareable = isinstance(spec, Mapping) and spec.get("shareable") is True
        if is_automatic(obj):
            auto = automatic_of(obj, name)
            if isinstance(auto, Broken):  # kept as planned until the spec is fixed
                fixed.append(Claim(name, planned_members(obj), shareable))
            else:
                autos.append(auto)
                current[name] = planned_members(obj)
            continue
        parsed = group_of(obj, name)
        if not isinstance(parsed, Broken):
            group = parsed[0]
            fixed.append(Claim(name, frozenset(g.uuid for n in nodes for g in n.gpus
                                               if group.holds(n.name, g)), shareable))
    return autos, fixed, current


def _status(members: frozenset[str], where: Mapping[str, str], busy: frozenset[str],
            conflicts: tuple[str, ...], unmet: int | None) -> Obj:
    gpus = sorted(members)
    status: Obj = {"members": {"gpus": gpus,
                               "nodes": sorted({where[u] for u in gpus if u in where})},
                   "capacity": {"gpus": len(gpus)},
                   "free": {"gpus": sum(1 for u in gpus if u not in busy)},
                   "conflicts": list(conflicts) or None}
    if unmet is not None:
        status["unmet"] = {"gpus": unmet}
    return {k: v for k, v in status.items() if v is not None}
