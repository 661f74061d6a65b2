"""Kubernetes objects -> core values: v1 Nodes + GPUDevices -> ``Node``; CRs -> catalogue.

* A node's CPU and memory are its ``status.allocatable``; its GPUs are the
  GPUDevice objects whose ``spec.node`` names it, ordered by ``spec.index``
  (read by ``gpupool.contract.devices``, as the controller reads them).
* A GPU takes new placements when ``status.health`` is ``Healthy``, it is not
  isolated (``status.isolation.state: Isolated``: the node agent caught a container
  using more than its slice) and its ``status.heartbeatTime`` is at most
  ``stale_after_s`` old (no heartbeat at all counts as fresh only while the object
  is younger than that). A GPU that does not is marked unhealthy in the core: it
  keeps its holders and takes nothing new.
* ``ResourceClass.spec.selector`` is a label selector over GPU labels;
  ``ResourceGroup.spec`` has ``nodes``, ``gpus`` (uuids), ``tenants``,
  ``models`` and ``quota`` (``gpus``, ``memoryMiB``, ``corePct``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpupool.contract import tenancy
from gpupool.contract.devices import DeviceRecord
from gpupool.core.classes import ResourceClass
from gpupool.core.errors import InvalidInput, QuantityError
from gpupool.core.groups import ResourceGroup
from gpupool.core.model import Gpu, Node, freeze_labels
from gpupool.core.quantity import to_mib, to_milli
from gpupool.core.quota import Limit
from gpupool.core.selector import Selector


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the extender keeps of a v1 Node."""

    name: str
    cpu_milli: int
    memory_mib: int
    labels: tuple[tuple[str, str], ...]


def node_facts(node: Any) -> NodeFacts:
    """From a lightkube ``Node`` model; unparsable allocatable counts as 0."""
    meta = node.metadata
    alloc = (node.status.allocatable if node.status is not None else None) or {}
    return NodeFacts(meta.name, _quiet(to_milli, alloc.get("cpu")),
                     _quiet(to_mib, alloc.get("memory")), freeze_labels(meta.labels))


def _quiet(parse: Any, value: Any) -> int:
    if value is None:
        return 0
    try:
        return int(parse(value))
    except QuantityError:
        return 0


def is_fresh(dev: DeviceRecord, now_s: float, stale_after_s: float) -> bool:
    """Takes placements by its own report (healthy, not isolated) and heard from within
    ``stale_after_s``."""
    if not dev.takes_placements:
        return False
    seen = dev.heartbeat_s if dev.heartbeat_s is not None else dev.created_s
    return seen is None or now_s - seen <= stale_after_s


def build_node(facts: NodeFacts, devices: Iterable[DeviceRecord], now_s: float,
               stale_after_s: float) -> Node:
    """The core ``Node``: GPUs by index, each healthy only if fresh."""
    gpus = sorted(devices, key=lambda d: (d.gpu.index, d.gpu.uuid))
    numa = max([d.gpu.numa_node for d in gpus] + [0]) + 1
    return Node(facts.name, facts.cpu_milli, facts.memory_mib,
                tuple(_with_health(d.gpu, is_fresh(d, now_s, stale_after_s)) for d in gpus),
                facts.labels, numa)


def _with_health(gpu: Gpu, healthy: bool) -> Gpu:
    return gpu if gpu.healthy == healthy else replace(gpu, healthy=healthy)


def resource_class(obj: Mapping[str, Any]) -> ResourceClass:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    selector = spec.get("selector") or {}
    if not isinstance(selector, Mapping):
        raise InvalidInput(f"ResourceClass {meta.get('name')}: spec.selector must be an object")
    return ResourceClass(str(meta.get("name") or ""), Selector.from_spec(selector))


def resource_group(obj: Mapping[str, Any]) -> tuple[ResourceGroup, Limit | None]:
    """The group and its quota (None: no quota)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    name = str(meta.get("name") or "")
    group = ResourceGroup(name, _names(spec, "nodes", name), _names(spec, "gpus", name),
                          _names(spec, "tenants", name), _names(spec, "models", name))
    if tenancy.is_automatic(obj):  # the members the controller planned
        group = ResourceGroup(name, frozenset(), tenancy.planned_members(obj), group.tenants,
                              group.models)
    quota = spec.get("quota")
    if quota is None:
        return group, None
    if not isinstance(quota, Mapping):
        raise InvalidInput(f"ResourceGroup {name}: spec.quota must be an object")
    return group, Limit(_opt_int(quota, "gpus", name), _opt_int(quota, "memoryMiB", name),
                        _opt_int(quota, "corePct", name))


def _names(spec: Mapping[str, Any], key: str, group: str) -> frozenset[str]:
    value = spec.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidInput(f"ResourceGroup {group}: spec.{key} must be a list of strings")
    return frozenset(value)


def _opt_int(quota: Mapping[str, Any], key: str, group: str) -> int | None:
    value = quota.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"ResourceGroup {group}: spec.quota.{key} must be a whole number")
    return value
