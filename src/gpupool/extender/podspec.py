"""Pod JSON (as kube-scheduler sends it) -> ``PodRequest``: the extender's edge.

Per container, ``resources.limits`` (falling back to ``requests``) may carry

* ``gpupool.io/gpu``: N GPUs (alone: exclusive whole GPUs);
* ``gpupool.io/gpu-memory``: MiB of GPU memory per GPU (a whole number);
* ``gpupool.io/gpu-core``: percent of one GPU's compute per GPU (1..100);
* ``class.gpupool.io/<class>``: N GPUs of resource class ``<class>``.

Memory or core without a count means one GPU. ``gpupool.io/mode``
(``exclusive``|``shared``) overrides the default mode (shared when memory or
core is asked, else exclusive); ``gpupool.io/affinity`` is ``pod`` or
``least-loaded``; the label ``gpupool.io/group`` names the resource group. The
tenant is the pod's namespace. The pod's CPU and memory are the larger of the
sum over containers and the largest init container (requests, else limits).

Anything absurd raises ``InvalidInput`` with a sentence that names the pod, the
container and the value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.contract import names
from gpupool.core.classes import class_of_resource
from gpupool.core.errors import InvalidInput, QuantityError
from gpupool.core.model import CORE_UNITS_PER_GPU
from gpupool.core.quantity import to_int, to_mib, to_milli
from gpupool.core.request import MAX_GPUS_PER_POD, Affinity, GpuDemand, Mode, PodRequest

MAX_GPU_MEMORY_MIB = 16 * 1024 * 1024  # 16 TiB per GPU: anything above is a typo


@dataclass(frozen=True, slots=True)
class PodId:
    """Who the pod is: uid (the allocation key), namespace and name."""

    uid: str
    namespace: str
    name: str

    @property
    def key(self) -> str:
        return self.uid or f"{self.namespace}/{self.name}"


def _map(value: Any, what: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{what} must be an object, got {type(value).__name__}")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidInput(f"{what} must be a list, got {type(value).__name__}")
    return value


def pod_id(pod: Mapping[str, Any]) -> PodId:
    meta = _map(pod.get("metadata"), "pod metadata")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidInput("the pod has no metadata.name")
    ns = meta.get("namespace") or "default"
    uid = meta.get("uid") or ""
    if not isinstance(ns, str) or not isinstance(uid, str):
        raise InvalidInput(f"pod {name}: metadata.namespace and metadata.uid must be strings")
    return PodId(uid, ns, name)


def is_gpupool_resource(name: str) -> bool:
    return name in (names.RESOURCE_GPU, names.RESOURCE_MEMORY, names.RESOURCE_CORE) or \
        name.startswith(names.CLASS_RESOURCE_PREFIX)


def pod_request(pod: Mapping[str, Any]) -> PodRequest:
    """The ``PodRequest`` of a v1.Pod given as decoded JSON."""
    who = pod_id(pod)
    where = f"pod {who.namespace}/{who.name}"
    meta = _map(pod.get("metadata"), f"{where}: metadata")
    spec = _map(pod.get("spec"), f"{where}: spec")
    annotations = _map(meta.get("annotations"), f"{where}: annotations")
    labels = _map(meta.get("labels"), f"{where}: labels")
    containers = _list(spec.get("containers"), f"{where}: spec.containers")
    inits = _list(spec.get("initContainers"), f"{where}: spec.initContainers")
    mode = _mode(annotations.get(names.ANNOTATION_MODE), where)
    demands: list[GpuDemand] = []
    classes: set[str] = set()
    cpu = mem = 0
    for c in containers:
        c = _map(c, f"{where}: a container")
        amounts = _resources(c, where)
        cpu += _cpu(amounts, where, c)
        mem += _memory(amounts, where, c)
        demand, gpu_class = _demand(amounts, mode, f"{where} container {c.get('name', '?')}",
                                    str(c.get("name") or ""))
        if demand is not None:
            demands.append(demand)
        if gpu_class:
            classes.add(gpu_class)
    for c in inits:
        amounts = _resources(_map(c, f"{where}: an init container"), where)
        cpu = max(cpu, _cpu(amounts, where, c))
        mem = max(mem, _memory(amounts, where, c))
    if len(classes) > 1:
        several = ", ".join(sorted(classes))
        raise InvalidInput(f"{where} asks for GPUs of several classes ({several}); "
                           "one pod may use one class")
    group = labels.get(names.LABEL_GROUP)
    if group is not None and (not isinstance(group, str) or not group):
        raise InvalidInput(f"{where}: label {names.LABEL_GROUP} must be a group name")
    return PodRequest(who.key, cpu, mem, tuple(demands), group=group or None,
                      tenant=who.namespace, affinity=_affinity(annotations, where),
                      gpu_class=next(iter(classes), None))


def _resources(container: Mapping[str, Any], where: str) -> dict[str, Any]:
    res = _map(container.get("resources"), f"{where}: container resources")
    merged = dict(_map(res.get("requests"), f"{where}: resources.requests"))
    merged.update(_map(res.get("limits"), f"{where}: resources.limits"))
    return merged


def _cpu(amounts: Mapping[str, Any], where: str, c: Mapping[str, Any]) -> int:
    try:
        return to_milli(amounts["cpu"]) if "cpu" in amounts else 0
    except QuantityError as exc:
        raise InvalidInput(f"{where} container {c.get('name', '?')}: cpu: {exc}") from None


def _memory(amounts: Mapping[str, Any], where: str, c: Mapping[str, Any]) -> int:
    try:
        return to_mib(amounts["memory"]) if "memory" in amounts else 0
    except QuantityError as exc:
        raise InvalidInput(f"{where} container {c.get('name', '?')}: memory: {exc}") from None


def _whole(amounts: Mapping[str, Any], key: str, where: str) -> int | None:
    if key not in amounts:
        return None
    try:
        return to_int(amounts[key], key)
    except QuantityError as exc:
        raise InvalidInput(f"{where}: {exc}") from None


def _demand(amounts: Mapping[str, Any], mode: Mode | None, where: str, container: str
            ) -> tuple[GpuDemand | None, str | None]:
    count = _whole(amounts, names.RESOURCE_GPU, where)
    memory = _whole(amounts, names.RESOURCE_MEMORY, where) or 0
    core = _whole(amounts, names.RESOURCE_CORE, where) or 0
    gpu_class, class_count = _class_amount(amounts, where)
    if class_count is not None:
        if count is not None and count != class_count:
            raise InvalidInput(f"{where}: {names.RESOURCE_GPU}={count} disagrees with "
                               f"{names.CLASS_RESOURCE_PREFIX}{gpu_class}={class_count}")
        count = class_count
    if count is None and not memory and not core:
        return None, None
    if count == 0:
        if memory or core:
            raise InvalidInput(f"{where}: {names.RESOURCE_GPU} is 0 but GPU memory or core "
                               "is asked")
        return None, None
    count = 1 if count is None else count
    _check_amounts(count, memory, core, where)
    chosen = mode or (Mode.SHARED if memory or core else Mode.EXCLUSIVE)
    return GpuDemand(count, memory, core, chosen, container), gpu_class


def _check_amounts(count: int, memory: int, core: int, where: str) -> None:
    if count > MAX_GPUS_PER_POD:
        raise InvalidInput(f"{where}: {count} GPUs asked, at most {MAX_GPUS_PER_POD} per container")
    if memory > MAX_GPU_MEMORY_MIB:
        raise InvalidInput(f"{where}: {names.RESOURCE_MEMORY}={memory} MiB per GPU is absurd "
                           "(it is MiB, e.g. 8192 for 8 GiB)")
    if core > CORE_UNITS_PER_GPU:
        raise InvalidInput(f"{where}: {names.RESOURCE_CORE}={core} must be 1..100 "
                           "(percent of one GPU)")


def _class_amount(amounts: Mapping[str, Any], where: str) -> tuple[str | None, int | None]:
    found = [k for k in amounts if isinstance(k, str) and k.startswith(names.CLASS_RESOURCE_PREFIX)]
    if not found:
        return None, None
    if len(found) > 1:
        raise InvalidInput(f"{where} asks for several classes ({', '.join(sorted(found))})")
    try:
        gpu_class = class_of_resource(found[0])
    except InvalidInput as exc:
        raise InvalidInput(f"{where}: {exc}") from None
    return gpu_class, _whole(amounts, found[0], where)


def _mode(value: Any, where: str) -> Mode | None:
    if value is None or value == "":
        return None
    try:
        return Mode(str(value).strip().lower())
    except ValueError:
        raise InvalidInput(f"{where}: annotation {names.ANNOTATION_MODE}={value!r} must be "
                           "exclusive or shared") from None


def _affinity(annotations: Mapping[str, Any], where: str) -> Affinity:
    value = annotations.get(names.ANNOTATION_AFFINITY)
    if value is None or value == "":
        return Affinity.LEAST_LOADED
    try:
        return Affinity(str(value).strip().lower())
    except ValueError:
        raise InvalidInput(f"{where}: annotation {names.ANNOTATION_AFFINITY}={value!r} must be "
                           "pod or least-loaded") from None
