"""What the webhook completes on a new GPU pod, so users write only resources.

* ``spec.schedulerName``: a pod that asks a gpupool resource and names no scheduler
  (or ``default-scheduler``) gets gpupool's scheduler, whose extender decides its GPUs.
  A pod naming another scheduler is left alone, with a warning: no gpupool decision
  will be made for it, so its GPU containers will be refused on the node.
* the implied ``gpupool.io/gpu``: kubelet calls the node agent's Allocate only for
  containers that ask the resource the agent advertises (``gpupool.io/gpu``). A
  container asking only ``gpupool.io/gpu-memory``/``gpu-core`` (one GPU),
  ``class.gpupool.io/<class>: N`` (N GPUs) or ``mig.gpupool.io/<profile>: N`` (N MIG
  devices) gets that count, in its limits and its
  requests (extended resources must have both equal), exactly as the scheduler
  extender reads the pod (``contract.podspec_request``), so nothing changes in what it
  decides. Init containers are left as they are: gpupool decides no GPU for them.

Patches are JSONPatch operations (RFC 6902). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from gpupool.contract import mig, names
from gpupool.core.request import PodRequest
from gpupool.webhook.review import Obj, pointer

DEFAULT_SCHEDULER = "default-scheduler"
GPUPOOL_PREFIXES = (names.GROUP + "/", names.CLASS_RESOURCE_PREFIX, mig.RESOURCE_PREFIX)


def _amount_keys(container: Mapping[str, Any]) -> Iterator[str]:
    res = container.get("resources")
    if not isinstance(res, Mapping):
        return
    for part in ("limits", "requests"):
        amounts = res.get(part)
        if isinstance(amounts, Mapping):
            yield from (str(k) for k in amounts)


def asks_gpupool(spec: Mapping[str, Any]) -> bool:
    """Whether any container or init container names a gpupool resource."""
    for key in ("containers", "initContainers"):
        items = spec.get(key)
        for c in items if isinstance(items, list) else ():
            if isinstance(c, Mapping) and any(k.startswith(GPUPOOL_PREFIXES)
                                              for k in _amount_keys(c)):
                return True
    return False


def scheduler_patch(spec: Mapping[str, Any], scheduler: str) -> list[Obj]:
    """Set ``spec.schedulerName`` when the pod names none (or the default one)."""
    named = spec.get("schedulerName")
    if named not in (None, "", DEFAULT_SCHEDULER):
        return []
    op = "add" if named is None else "replace"
    return [{"op": op, "path": "/spec/schedulerName", "value": scheduler}]


def other_scheduler_warning(spec: Mapping[str, Any], scheduler: str) -> list[str]:
    named = spec.get("schedulerName")
    if named in (None, "", DEFAULT_SCHEDULER, scheduler):
        return []
    return [f"the pod asks gpupool resources but names scheduler {named!r}: only "
            f"{scheduler} makes gpupool decisions, so its GPU containers will be refused"]


def implied_gpu_patch(spec: Mapping[str, Any], request: PodRequest) -> list[Obj]:
    """Add ``gpupool.io/gpu: N`` to each container whose GPU demand does not name it."""
    counts = {d.container: d.count for d in request.gpus}
    ops: list[Obj] = []
    containers = spec.get("containers")
    for i, c in enumerate(containers if isinstance(containers, list) else ()):
        if not isinstance(c, Mapping):
            continue
        count = counts.get(str(c.get("name") or ""))
        if count is None or names.RESOURCE_GPU in set(_amount_keys(c)):
            continue
        ops += _add_amount(i, c, str(count))
    return ops


def _add_amount(index: int, container: Mapping[str, Any], value: str) -> list[Obj]:
    base = ("spec", "containers", index, "resources")
    res = container.get("resources")
    if not isinstance(res, Mapping):
        return [{"op": "add", "path": pointer(*base),
                 "value": {"limits": {names.RESOURCE_GPU: value},
                           "requests": {names.RESOURCE_GPU: value}}}]
    ops: list[Obj] = []
    for part in ("limits", "requests"):
        if isinstance(res.get(part), Mapping):
            ops.append({"op": "add", "path": pointer(*base, part, names.RESOURCE_GPU),
                        "value": value})
        else:
            ops.append({"op": "add", "path": pointer(*base, part),
                        "value": {names.RESOURCE_GPU: value}})
    return ops
