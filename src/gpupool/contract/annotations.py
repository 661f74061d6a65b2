"""Encode and decode a placement decision as pod annotations.

The decision is the ``gpupool.io/allocation`` annotation, compact JSON::

    {"v": 1, "node": "n7", "cpuMilli": 4000, "memoryMiB": 8192, "exclusive": false,
     "containers": [{"name": "main",
                     "gpus": [{"uuid": "GPU-…", "index": 3, "memoryMiB": 4096, "corePct": 30}]}]}

plus ``gpupool.io/node``, ``gpupool.io/bind-time`` (RFC 3339, UTC) and
``gpupool.io/phase`` (allocating → allocated | failed, with ``gpupool.io/reason``).
``index`` is the GPU's position on its node in the order the node publishes.

A slice served by a slice server (``Allocation.served_by``, docs/remote.md) is recorded as
version 2 with ``"servedBy"``: the node whose GPUs the slices are on (``index`` and
``uuid`` are that node's); ``node`` stays the node the pod runs on, which holds its CPU
and memory. Every other decision is written as version 1, as before, and a version-1
decision is read as served by the pod's own node. A component that reads only version 1
refuses a version-2 decision rather than taking a remote slice for a local one.

A burstable slice (docs/design/burst.md) adds ``"memoryLimitMiB"`` and/or
``"coreLimitPct"`` to its GPU entry: the most the container may use, above the request
(``memoryMiB``, ``corePct``) that was placed and charged. An entry without them has a limit
equal to its request (every decision written before). The version stays the same: a reader
that ignores the limits enforces the request, which grants less, never more.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.contract import names
from gpupool.core.allocation import Allocation, Slice
from gpupool.core.errors import InvalidInput
from gpupool.core.model import CORE_UNITS_PER_GPU

VERSION = 1
VERSION_SERVED = 2
"""The version of a decision served by a slice server (it carries ``servedBy``)."""
MAX_ANNOTATION_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Decision:
    """A pod's recorded decision: its allocation, phase and bind time."""

    allocation: Allocation
    phase: str
    bind_time: str
    reason: str = ""


def encode(alloc: Allocation, bind_time: str, phase: str = names.PHASE_ALLOCATING
           ) -> dict[str, str]:
    """The annotations that record ``alloc`` (merge them into the pod's metadata)."""
    if phase not in names.PHASES:
        raise InvalidInput(f"unknown phase {phase!r}")
    containers: dict[str, list[dict[str, Any]]] = {}
    for s in alloc.slices:
        containers.setdefault(s.container, []).append(_gpu_entry(s))
    body: dict[str, Any] = {
        "v": VERSION, "node": alloc.node, "cpuMilli": alloc.cpu_milli,
        "memoryMiB": alloc.memory_mib, "exclusive": alloc.exclusive,
        "containers": [{"name": n, "gpus": g} for n, g in containers.items()],
    }
    if alloc.served_by:
        body.update({"v": VERSION_SERVED, "servedBy": alloc.served_by})
    return {
        names.ANNOTATION_NODE: alloc.node,
        names.ANNOTATION_ALLOCATION: json.dumps(body, separators=(",", ":"), sort_keys=True),
        names.ANNOTATION_BIND_TIME: bind_time,
        names.ANNOTATION_PHASE: phase,
    }


def has_decision(annotations: Mapping[str, str] | None) -> bool:
    return bool(annotations) and names.ANNOTATION_ALLOCATION in (annotations or {})


def decode(key: str, annotations: Mapping[str, str]) -> Decision:
    """The decision recorded in ``annotations``; ``InvalidInput`` says what is broken."""
    raw = annotations.get(names.ANNOTATION_ALLOCATION)
    if raw is None:
        raise InvalidInput(f"pod {key} has no {names.ANNOTATION_ALLOCATION} annotation")
    if len(raw) > MAX_ANNOTATION_BYTES:
        raise InvalidInput(f"pod {key}: {names.ANNOTATION_ALLOCATION} is too large")
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"pod {key}: {names.ANNOTATION_ALLOCATION} is not JSON ({exc})"
        ) from None
    if not isinstance(body, dict) or body.get("v") not in (VERSION, VERSION_SERVED):
        raise InvalidInput(f"pod {key}: {names.ANNOTATION_ALLOCATION} is not version "
                           f"{VERSION} or {VERSION_SERVED}")
    node = _field(key, body, "node", str)
    served_by = _served_by(key, body)
    if annotations.get(names.ANNOTATION_NODE, node) != node:
        raise InvalidInput(f"pod {key}: {names.ANNOTATION_NODE} disagrees with the allocation")
    slices = []
    for c in _field(key, body, "containers", list):
        if not isinstance(c, dict):
            raise InvalidInput(f"pod {key}: a container entry is not an object")
        cname = c.get("name")
        if not isinstance(cname, str):  # "" is the unnamed container of core requests
            raise InvalidInput(f"pod {key}: allocation field 'name' is missing or not a str")
        for g in _field(key, c, "gpus", list):
            if not isinstance(g, dict):
                raise InvalidInput(f"pod {key}: a GPU entry of {cname} is not an object")
            slices.append(_slice_of(key, g, cname))
    exclusive = body.get("exclusive", False)
    if not isinstance(exclusive, bool):
        raise InvalidInput(f"pod {key}: allocation field 'exclusive' must be true or false")
    alloc = Allocation(key, node, _nat(key, body, "cpuMilli"), _nat(key, body, "memoryMiB"),
                       tuple(slices), exclusive, served_by)
    phase = annotations.get(names.ANNOTATION_PHASE, names.PHASE_ALLOCATING)
    if phase not in names.PHASES:
        raise InvalidInput(f"pod {key}: unknown phase {phase!r}")
    return Decision(alloc, phase, annotations.get(names.ANNOTATION_BIND_TIME, ""),
                    annotations.get(names.ANNOTATION_REASON, ""))


def holding(key: str, annotations: Mapping[str, str] | None, node: str | None
            ) -> Allocation | None:
    """What a live pod holds by its decision: None when it has none, when the node agent
    marked it ``failed``, or when it names another node than the one the pod is bound to
    (``node``; empty or None: not bound yet). ``InvalidInput`` when it cannot be read.
    (The extender's cache and the controller both count holdings by this rule.)"""
    if not has_decision(annotations):
        return None
    decision = decode(key, annotations or {})
    if decision.phase == names.PHASE_FAILED or (node and decision.allocation.node != node):
        return None
    return decision.allocation


def group_of(annotations: Any, labels: Any) -> str | None:
    """The resource group a pod is charged to. A pod with a decision: exactly the one
    bind recorded and signed (``gpupool.io/resource-group``; absent or empty: none), never
    its label, which its author may change after the bind. A pod not bound yet: the one its
    ``gpupool.io/group`` label asks for. (A pod's annotations and labels as given;
    anything but a map counts as empty.)"""
    notes = annotations if isinstance(annotations, Mapping) else {}
    if has_decision(notes):
        group = notes.get(names.ANNOTATION_RESOURCE_GROUP)
    else:
        group = labels.get(names.LABEL_GROUP) if isinstance(labels, Mapping) else None
    return str(group) if group else None


def phase_patch(phase: str, reason: str = "") -> dict[str, str]:
    """Annotations that advance the phase (the node agent's write)."""
    if phase not in names.PHASES:
        raise InvalidInput(f"unknown phase {phase!r}")
    patch = {names.ANNOTATION_PHASE: phase}
    if reason:
        patch[names.ANNOTATION_REASON] = reason[:1024]
    return patch


def _gpu_entry(s: Slice) -> dict[str, Any]:
    entry: dict[str, Any] = {"uuid": s.gpu_uuid, "index": s.gpu_position,
                             "memoryMiB": s.memory_mib, "corePct": s.core_pct}
    if s.burst_memory_mib:
        entry["memoryLimitMiB"] = s.memory_limit_mib
    if s.burst_core_pct:
        entry["coreLimitPct"] = s.core_limit_pct
    return entry


def _slice_of(key: str, g: Mapping[str, Any], container: str) -> Slice:
    """One GPU entry; a limit absent (every decision without a burst) is the request."""
    memory, core = _nat(key, g, "memoryMiB"), _nat(key, g, "corePct")
    memory_limit = _nat(key, g, "memoryLimitMiB") if "memoryLimitMiB" in g else memory
    core_limit = _nat(key, g, "coreLimitPct") if "coreLimitPct" in g else core
    if memory_limit < memory or not core <= core_limit <= CORE_UNITS_PER_GPU:
        raise InvalidInput(f"pod {key}: a GPU entry of {container} has a limit below its "
                           f"request or above a whole GPU ({memory_limit} MiB for {memory}, "
                           f"{core_limit} % for {core})")
    return Slice(_field(key, g, "uuid", str), _nat(key, g, "index"), memory, core, container,
                 memory_limit - memory, core_limit - core)


def _served_by(key: str, body: Mapping[str, Any]) -> str:
    """Version 2 names its serving node; version 1 must not (it is served locally)."""
    if body.get("v") == VERSION:
        if "servedBy" in body:
            raise InvalidInput(f"pod {key}: allocation field 'servedBy' needs version "
                               f"{VERSION_SERVED}")
        return ""
    return str(_field(key, body, "servedBy", str))


def _field(key: str, obj: Mapping[str, Any], name: str, kind: type) -> Any:
    value = obj.get(name)
    if not isinstance(value, kind) or (kind is str and not value):
        raise InvalidInput(f"pod {key}: allocation field {name!r} is missing or not a "
                           f"{kind.__name__}")
    return value


def _nat(key: str, obj: Mapping[str, Any], name: str) -> int:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value > 2**40:
        raise InvalidInput(f"pod {key}: allocation field {name!r} must be a whole number >= 0")
    return value
