"""Pods as the node agent needs them: identity, GPU containers, decision.

Translated once at the edge from the API server's JSON; nothing past this
module reads a pod dict.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.contract import annotations as contract
from gpupool.contract import names
from gpupool.contract.podspec_request import container_amounts, gpu_numbers
from gpupool.core.errors import InvalidInput
from gpupool.core.request import Affinity, GpuDemand, Mode, PodRequest

ANNOTATION_DEVICES = names.ANNOTATION_DEVICES
"""Written by the node agent: {container: {logical device ID: GPU uuid}} it served."""

TERMINAL_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class GpuContainer:
    """A container that asks for ``gpupool.io/gpu``, in kubelet's allocation order."""

    name: str
    count: int
    memory_mib: int
    core_pct: int
    env: tuple[str, ...] = ()  # names the container's own ``env`` sets
    env_from: tuple[str, ...] = ()  # the prefix of each ``envFrom`` source ("" if none)


@dataclass(frozen=True, slots=True)
class Pod:
    """The parts of a pod the agent reads."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    created: str
    node: str
    phase: str
    deleting: bool
    annotations: Mapping[str, str]
    containers: tuple[GpuContainer, ...]
    problem: str = ""  # why the GPU containers could not be read (they are then empty)
    asks_gpu: bool = True  # some container asks a gpupool GPU resource (any of them)
    container_ids: tuple[tuple[str, str], ...] = ()  # (runtime container id, container name)
    ip: str = ""  # status.podIP (a slice server's, for its usage: ``slices``)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def active(self) -> bool:
        return self.phase not in TERMINAL_PHASES

    @property
    def signature(self) -> str | None:
        return self.annotations.get(names.ANNOTATION_SIGNATURE)

    def container_named(self, runtime_id: str) -> str | None:
        """The name of the container the runtime knows as ``runtime_id``."""
        return next((n for i, n in self.container_ids if i == runtime_id), None)

    def served(self) -> dict[str, dict[str, str]]:
        """What the agent recorded as served: container -> {logical ID: GPU uuid}."""
        raw = self.annotations.get(ANNOTATION_DEVICES)
        if not raw:
            return {}
        return {k: dict(v) for k, v in _served(self.ref, raw).items()}

    def decision(self) -> contract.Decision | None:
        """The recorded decision, None without one; ``InvalidInput`` if it is broken."""
        if not contract.has_decision(self.annotations):
            return None
        return _decision(self.uid, tuple((k, self.annotations[k]) for k in _DECISION_KEYS
                                         if k in self.annotations))

    def request(self) -> PodRequest:
        """What the pod asks for, as the core's request (GPU part only)."""
        mode = self.annotations.get(names.ANNOTATION_MODE)
        affinity = self.annotations.get(names.ANNOTATION_AFFINITY, Affinity.LEAST_LOADED.value)
        try:
            aff = Affinity(affinity)
        except ValueError:
            raise InvalidInput(f"pod {self.ref}: {names.ANNOTATION_AFFINITY} must be "
                               f"'pod' or 'least-loaded', not {affinity!r}") from None
        return PodRequest(self.uid, gpus=tuple(_demand(self, c, mode) for c in self.containers),
                          affinity=aff)


_DECISION_KEYS = (names.ANNOTATION_ALLOCATION, names.ANNOTATION_NODE, names.ANNOTATION_BIND_TIME,
                  names.ANNOTATION_PHASE, names.ANNOTATION_REASON)


@functools.lru_cache(maxsize=4096)
def _decision(uid: str, annotations: tuple[tuple[str, str], ...]) -> contract.Decision:
    """Decoded decisions, remembered (an Allocate reads every pod's decision)."""
    return contract.decode(uid, dict(annotations))


@functools.lru_cache(maxsize=4096)
def _served(ref: str, raw: str) -> dict[str, dict[str, str]]:
    try:
        body = json.loads(raw)
    except json.JSONDecodeError:
        raise InvalidInput(f"pod {ref}: {ANNOTATION_DEVICES} is not JSON") from None
    if not isinstance(body, dict) or not all(
            isinstance(v, dict) and all(isinstance(x, str) for x in v.values())
            for v in body.values()):
        raise InvalidInput(f"pod {ref}: {ANNOTATION_DEVICES} is malformed")
    return {str(k): {str(a): b for a, b in v.items()} for k, v in body.items()}


def _demand(pod: Pod, c: GpuContainer, mode: str | None) -> GpuDemand:
    if mode not in (None, Mode.EXCLUSIVE.value, Mode.SHARED.value):
        raise InvalidInput(f"pod {pod.ref}: {names.ANNOTATION_MODE} must be 'exclusive' or "
                           f"'shared', not {mode!r}")
    shared = c.memory_mib > 0 or c.core_pct > 0
    chosen = Mode(mode) if mode else (Mode.SHARED if shared else Mode.EXCLUSIVE)
    return GpuDemand(c.count, c.memory_mib, c.core_pct, chosen, c.name)


def pod_from_json(obj: Mapping[str, Any]) -> Pod:
    """The agent's view of a pod object (a malformed GPU quantity goes to ``problem``)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    ref = f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"
    containers = [c for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])
                  if isinstance(c, dict)]
    problem = ""
    try:
        gpu = tuple(g for g in (_gpu_container(ref, c) for c in containers) if g is not None)
    except InvalidInput as exc:
        gpu, problem = (), str(exc)
    status = obj.get("status") or {}
    return Pod(
        namespace=str(meta.get("namespace", "default")), name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")), resource_version=str(meta.get("resourceVersion", "")),
        created=str(meta.get("creationTimestamp", "")), node=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase", "Pending")),
        deleting=bool(meta.get("deletionTimestamp")),
        annotations=dict(meta.get("annotations") or {}), containers=gpu, problem=problem,
        asks_gpu=bool(gpu) or any(_asks_gpu(c) for c in containers),
        container_ids=_runtime_ids(status), ip=str(status.get("podIP") or ""))


def _gpu_container(ref: str, c: Mapping[str, Any]) -> GpuContainer | None:
    """The container's ``gpupool.io/gpu`` request, read as the extender reads it (kubelet
    calls Allocate only for containers that ask for the device plugin's resource)."""
    name = str(c.get("name", ""))
    where = f"pod {ref} container {name}"
    count, memory, core = gpu_numbers(container_amounts(c, where), where)
    if not count:
        return None
    env = tuple(str(e.get("name", "")) for e in c.get("env") or () if isinstance(e, dict))
    env_from = tuple(str(e.get("prefix") or "") for e in c.get("envFrom") or ()
                     if isinstance(e, dict))
    return GpuContainer(name, count, memory, core, env, env_from)


_GPU_RESOURCES = (names.RESOURCE_GPU, names.RESOURCE_MEMORY, names.RESOURCE_CORE)


def _asks_gpu(c: Mapping[str, Any]) -> bool:
    """Does the container name a gpupool GPU resource (any amount but zero)? Read leniently:
    a decision on a pod whose containers ask none is refused, whatever else they say."""
    res = c.get("resources")
    if not isinstance(res, dict):
        return False
    for part in (res.get("limits"), res.get("requests")):
        for key, value in (part.items() if isinstance(part, dict) else ()):
            gpu_key = key in _GPU_RESOURCES or str(key).startswith(names.CLASS_RESOURCE_PREFIX)
            if gpu_key and str(value).strip() not in ("0", ""):
                return True
    return False


def _runtime_ids(status: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """(container id without its ``containerd://`` style prefix, name) from the status."""
    out = []
    for key in ("initContainerStatuses", "containerStatuses"):
        for st in status.get(key) or ():
            if isinstance(st, dict) and isinstance(st.get("containerID"), str):
                out.append((st["containerID"].partition("://")[2], str(st.get("name", ""))))
    return tuple(out)

