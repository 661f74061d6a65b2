"""A pod's ResourceClaims -> the core ``PodRequest`` gpupool scores DRA nodes for.

The pod names its claims in ``spec.resourceClaims``: by ``resourceClaimName``, or by
``resourceClaimTemplateName``, whose claim the API server's resource-claim controller
creates and names in ``status.resourceClaimStatuses`` (kube-scheduler waits for it before
it schedules the pod). Claims are looked up in the pod's namespace among those the cache
watches; a claim already allocated holds its GPUs already (nothing is left to choose) and
one not created yet is skipped.

Each device request of gpupool's driver (its ``deviceClassName`` is ``gpu.gpupool.io`` or
``<class>.gpupool.io``) becomes one ``GpuDemand`` of ``count`` GPUs:

* no ``capacity.requests``: whole GPUs (exclusive);
* ``memory`` and ``cores``: a shared slice of that memory (MiB, rounded up) and percent;
* only ``memory``: the slice and all of the compute; only ``cores``: all of the memory
  (the slice's ``requestPolicy.default`` is the whole capacity), so no other claim fits
  beside it: placed as a whole GPU.

``<class>.gpupool.io`` narrows the GPUs to that ResourceClass when the extender knows the
class (several classes in one pod: the first). This request is the pod's score when the
claims ask plain GPUs (``firstAvailable`` read as its first sub-request, ``allocationMode:
All`` not read; ``filter-claims`` charges quota per node through ``draquota``); claims
with CEL selectors, ``All``, alternatives or constraints are scored through ``draasks``
and ``draselect``.
kube-scheduler's DRA plugin still filters and allocates; these scores only rank the nodes
it finds feasible. Requests of other drivers are not read. Anything unreadable raises
``InvalidInput`` naming the pod and claim.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpupool.contract.dra import CAPACITY_CORES, CAPACITY_MEMORY, DRIVER
from gpupool.core.errors import InvalidInput, QuantityError
from gpupool.core.model import CORE_UNITS_PER_GPU
from gpupool.core.quantity import parse_quantity, to_mib
from gpupool.core.request import MAX_GPUS_PER_POD, GpuDemand, Mode, PodRequest
from gpupool.extender.state.draclaims import CLASS_SUFFIX, ClaimRecord, DraClaims

DRIVER_CLASS = DRIVER  # the class of every gpupool GPU


def has_claims(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec")
    return isinstance(spec, Mapping) and bool(spec.get("resourceClaims"))


def claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The names of the ResourceClaims the pod uses that exist already."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    made = {s.get("name"): s.get("resourceClaimName")
            for s in _list(status.get("resourceClaimStatuses")) if isinstance(s, Mapping)}
    names = []
    for entry in _list(spec.get("resourceClaims")):
        if not isinstance(entry, Mapping):
            continue
        name = entry.get("resourceClaimName") or made.get(entry.get("name"))
        if isinstance(name, str) and name:
            names.append(name)
    return names


def claims_request(pod: Mapping[str, Any], base: PodRequest, claims: DraClaims,
                   classes: frozenset[str]) -> PodRequest:
    """``base`` (the pod's CPU and memory) with a GPU demand per unallocated device request
    of gpupool's driver; ``classes``: the ResourceClasses the extender knows."""
    namespace = base.tenant or "default"
    demands: list[GpuDemand] = []
    gpu_class: str | None = None
    for name in claim_names(pod):
        record = claims.record(namespace, name)
        if record is None or record.allocated:
            continue
        for demand, cls in _demands(record):
            demands.append(demand)
            gpu_class = gpu_class or (cls if cls in classes else None)
    if sum(d.count for d in demands) > MAX_GPUS_PER_POD:
        raise InvalidInput(f"pod {base.key}: its claims ask more than {MAX_GPUS_PER_POD} GPUs")
    return replace(base, gpus=tuple(demands), gpu_class=gpu_class)


def _demands(record: ClaimRecord) -> list[tuple[GpuDemand, str | None]]:
    out = []
    for raw in record.requests:
        name = str(raw.get("name") or "?")
        exactly = raw.get("exactly")
        if not isinstance(exactly, Mapping):
            first = _list(raw.get("firstAvailable"))
            exactly = first[0] if first and isinstance(first[0], Mapping) else None
        if exactly is None:
            continue
        where = f"ResourceClaim {record.namespace}/{record.name} request {name}"
        demand = _demand(exactly, where, f"{record.name}/{name}")
        if demand is not None:
            out.append(demand)
    return out


def _demand(ask: Mapping[str, Any], where: str, label: str
            ) -> tuple[GpuDemand, str | None] | None:
    """One request's demand and class (None: not gpupool's, or not scored)."""
    if ask.get("allocationMode", "ExactCount") != "ExactCount":
        return None
    return device_demand(ask, where, label)


def device_demand(ask: Mapping[str, Any], where: str, label: str, count_default: int = 1
                   ) -> tuple[GpuDemand, str | None] | None:
    """The demand of one device request or sub-request of gpupool's driver (None: another
    driver's); ``allocationMode`` is the caller's."""
    device_class = ask.get("deviceClassName")
    if not isinstance(device_class, str) or not device_class.endswith(CLASS_SUFFIX):
        return None
    count = ask.get("count", count_default)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_GPUS_PER_POD:
        raise InvalidInput(f"{where}: count must be 1..{MAX_GPUS_PER_POD}, got {count!r}")
    capacity = ask.get("capacity")
    asked = capacity.get("requests") if isinstance(capacity, Mapping) else None
    cls = None if device_class == DRIVER_CLASS else device_class[:-len(CLASS_SUFFIX)]
    if not isinstance(asked, Mapping) or not asked:
        return GpuDemand(count, mode=Mode.EXCLUSIVE, container=label), cls
    memory, cores = asked.get(CAPACITY_MEMORY), asked.get(CAPACITY_CORES)
    if memory is None:
        return GpuDemand(count, mode=Mode.EXCLUSIVE, container=label), cls
    core_pct = CORE_UNITS_PER_GPU if cores is None else _cores(cores, where)
    try:
        memory_mib = to_mib(memory)
    except QuantityError as exc:
        raise InvalidInput(f"{where}: capacity memory: {exc}") from None
    return GpuDemand(count, memory_mib, core_pct, Mode.SHARED, label), cls


def _cores(value: Any, where: str) -> int:
    try:
        q = parse_quantity(value)
    except QuantityError as exc:
        raise InvalidInput(f"{where}: capacity cores: {exc}") from None
    pct = -(-q.numerator // q.denominator)
    if not 0 < pct <= CORE_UNITS_PER_GPU:
        raise InvalidInput(f"{where}: capacity cores must be 1..{CORE_UNITS_PER_GPU}, "
                           f"got {value!r}")
    return pct


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
