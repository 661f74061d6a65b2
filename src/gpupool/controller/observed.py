"""What the controller sees, as values: GPUs from GPUDevices, decisions from pods.

The raw objects (decoded JSON dicts) are kept for the custom resources the
controller writes (their ``status`` and ``metadata`` are compared with what it
wants); GPUDevices and pods are translated here once, at the edge. A broken
GPUDevice or pod never stops the controller: it becomes a ``Problem`` that
names the object and what is wrong with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.contract import annotations as records
from gpupool.contract import names
from gpupool.contract.podspec_request import gpu_class_of
from gpupool.core.allocation import Allocation
from gpupool.core.errors import InvalidInput
from gpupool.core.model import Gpu, freeze_labels

Obj = dict[str, Any]

ANNOTATION_RESOURCE_GROUP = names.ANNOTATION_RESOURCE_GROUP
"""Written by the extender at bind: the group the pod was charged to (chosen or named).
The same key as ``gpupool.extender.pods.ANNOTATION_RESOURCE_GROUP`` (a test holds them equal)."""

TERMINAL_PHASES = names.POD_TERMINAL_PHASES


@dataclass(frozen=True, slots=True)
class Problem:
    """An object the controller could not read, and why (a sentence)."""

    kind: str
    name: str
    message: str


@dataclass(frozen=True, slots=True)
class PlacedGpu:
    """One GPU published by a GPUDevice, with the node it is in."""

    node: str
    gpu: Gpu


@dataclass(frozen=True, slots=True)
class PodHolding:
    """A live pod gpupool placed: what it holds and whom it is charged to."""

    key: str  # the pod's uid (the allocation key)
    pod: str  # namespace/name, for people
    tenant: str
    gpu_class: str | None
    group: str | None
    allocation: Allocation


@dataclass(frozen=True, slots=True)
class Observed:
    """One consistent view of the cluster, as the controller reconciles it."""

    gpus: tuple[PlacedGpu, ...]
    classes: tuple[Obj, ...]  # ResourceClass objects, raw
    groups: tuple[Obj, ...]  # ResourceGroup objects, raw
    holdings: tuple[PodHolding, ...]
    problems: tuple[Problem, ...] = ()
    unreadable_pods: tuple[tuple[Obj, str], ...] = ()  # (pod, why) of broken decisions


def name_of(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("name") or "") if isinstance(meta, Mapping) else ""


def gpu_of_device(obj: Mapping[str, Any]) -> PlacedGpu:
    """The GPU a GPUDevice publishes; ``InvalidInput`` names the field that is wrong."""
    name = name_of(obj) or "?"
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise InvalidInput(f"GPUDevice {name}: spec must be an object")
    node, uuid, model = spec.get("node"), spec.get("uuid"), spec.get("model")
    index, memory = spec.get("index"), spec.get("memoryMiB")
    for field, value in (("node", node), ("uuid", uuid), ("model", model)):
        if not isinstance(value, str) or not value:
            raise InvalidInput(f"GPUDevice {name}: spec.{field} must be a non-empty string")
    if not _whole(index) or not _whole(memory) or memory == 0:
        raise InvalidInput(f"GPUDevice {name}: spec.index and spec.memoryMiB must be whole "
                           f"numbers (memoryMiB > 0), got {index!r} and {memory!r}")
    labels = spec.get("labels") or {}
    if not isinstance(labels, Mapping):
        raise InvalidInput(f"GPUDevice {name}: spec.labels must be a map of strings")
    arch = spec.get("architecture")
    if isinstance(arch, str) and arch:
        labels = {"gpupool.io/architecture": arch, **labels}
    numa = spec.get("numaNode")
    healthy = _map(obj.get("status")).get("health", "Healthy") == "Healthy"
    gpu = Gpu(str(uuid), int(str(index)), str(model), int(str(memory)),
              int(str(numa)) if _whole(numa) else 0, healthy,
              freeze_labels({str(k): str(v) for k, v in labels.items()}))
    return PlacedGpu(str(node), gpu)


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def holding_of(pod: Mapping[str, Any]) -> PodHolding | None:
    """What a pod holds (None: nothing — no decision, finished, or a failed decision).

    A decision that cannot be read raises ``InvalidInput`` saying why.
    """
    meta = _map(pod.get("metadata"))
    notes = _map(meta.get("annotations"))
    if not records.has_decision(notes):
        return None
    spec = _map(pod.get("spec"))
    if _map(pod.get("status")).get("phase") in TERMINAL_PHASES:
        return None
    ns, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
    key = str(meta.get("uid") or f"{ns}/{name}")
    decision = records.decode(key, {str(k): str(v) for k, v in notes.items()})
    node = spec.get("nodeName")
    if decision.phase == names.PHASE_FAILED or (node and decision.allocation.node != node):
        return None
    group = notes.get(ANNOTATION_RESOURCE_GROUP) or _map(meta.get("labels")).get(names.LABEL_GROUP)
    return PodHolding(key, f"{ns}/{name}", ns, gpu_class_of(pod), str(group) if group else None,
                      decision.allocation)


def observe(devices: Iterable[Mapping[str, Any]], classes: Iterable[Mapping[str, Any]],
            groups: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> Observed:
    """Translate listed objects into an ``Observed`` (never raises on a broken object)."""
    gpus: list[PlacedGpu] = []
    problems: list[Problem] = []
    for dev in devices:
        try:
            gpus.append(gpu_of_device(dev))
        except InvalidInput as exc:
            problems.append(Problem("GPUDevice", name_of(dev), str(exc)))
    holdings: list[PodHolding] = []
    unreadable: list[tuple[Obj, str]] = []
    for pod in pods:
        try:
            held = holding_of(pod)
        except InvalidInput as exc:
            unreadable.append((dict(pod), str(exc)))
            problems.append(Problem("Pod", _pod_name(pod), str(exc)))
            continue
        if held is not None:
            holdings.append(held)
    return Observed(tuple(gpus), tuple(dict(c) for c in classes), tuple(dict(g) for g in groups),
                    tuple(holdings), tuple(problems), tuple(unreadable))


def _pod_name(pod: Mapping[str, Any]) -> str:
    meta = _map(pod.get("metadata"))
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or '?'}"
