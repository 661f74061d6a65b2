"""A v1.Pod (decoded JSON or YAML) -> ``PodRequest``: the pod resources users type.

Per container, ``resources.limits`` over ``resources.requests`` may carry

* ``gpupool.io/gpu``: N GPUs on N different physical GPUs (alone: exclusive);
* ``gpupool.io/gpu-memory``: MiB of GPU memory per GPU (a whole number);
* ``gpupool.io/gpu-core``: percent of one GPU's compute per GPU (1..100);
* ``class.gpupool.io/<class>``: N GPUs of resource class ``<class>``;
* ``mig.gpupool.io/<profile>``: N MIG devices of that profile, each whole
  (``contract.mig``; alone, or with ``gpupool.io/gpu`` equal to N);
* ``gpupool.io/remote-gpu``: N GPUs of a ``remote-required`` pod, in place of
  ``gpupool.io/gpu`` (which kube-scheduler counts against the node's own GPUs and kubelet
  hands out through the node's device plugin; the admission webhook renames it,
  docs/remote.md).

Memory or core without a count means one GPU. The annotation
``gpupool.io/mode`` (``exclusive``|``shared``) overrides the default mode
(shared when memory or core is asked, else exclusive); ``gpupool.io/affinity``
is ``pod`` or ``least-loaded``; ``gpupool.io/placement`` is ``local`` (the
default), ``remote-allowed`` or ``remote-required`` (where the GPU slices may be
served, docs/remote.md); ``gpupool.io/gpu-memory-limit`` and ``gpupool.io/gpu-core-limit``
make shared slices burstable (``contract.burst``); the label ``gpupool.io/group`` names the
resource group. The tenant is the namespace. CPU and memory are the larger of
the containers' sum and the largest init container, a sidecar (an init container with
``restartPolicy: Always``) adding to both as in Kubernetes.

These are the rules the scheduler extender applies to the same pods
(``tests/cli/test_podspec_request.py`` holds the two translations to the same
answers). Bad input raises ``InvalidInput`` naming the pod, the container and
the value. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpupool.contract import burst, mig, names
from gpupool.core.classes import class_of_resource
from gpupool.core.errors import InvalidInput, QuantityError
from gpupool.core.model import CORE_UNITS_PER_GPU
from gpupool.core.quantity import to_int, to_mib, to_milli
from gpupool.core.request import MAX_GPUS_PER_POD, Affinity, GpuDemand, Mode, PodRequest, Serving

MAX_GPU_MEMORY_MIB = 16 * 1024 * 1024
"""More than 16 TiB of memory per GPU is taken for a unit mistake (bytes for MiB)."""


def _obj(value: Any, what: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{what} must be a map, got {type(value).__name__}")
    return value


def _seq(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidInput(f"{what} must be a list, got {type(value).__name__}")
    return value


def pod_where(pod: Mapping[str, Any]) -> tuple[str, str, str]:
    """(namespace, name, uid) of ``pod``; a pod needs a name."""
    meta = _obj(pod.get("metadata"), "the pod's metadata")
    name, ns, uid = meta.get("name"), meta.get("namespace") or "default", meta.get("uid") or ""
    if not isinstance(name, str) or not name:
        raise InvalidInput("the pod has no metadata.name")
    if not isinstance(ns, str) or not isinstance(uid, str):
        raise InvalidInput(f"pod {name}: metadata.namespace and metadata.uid must be strings")
    return ns, name, uid


def container_amounts(container: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The container's resources as the scheduler counts them: its requests, and its
    limits where a resource has no request (the API server defaults a missing request
    to the limit; extended resources such as ``gpupool.io/*`` must have both equal)."""
    res = _obj(container.get("resources"), f"{where}: resources")
    amounts = dict(_obj(res.get("limits"), f"{where}: resources.limits"))
    amounts.update(_obj(res.get("requests"), f"{where}: resources.requests"))
    return amounts


def gpu_class_of(pod: Mapping[str, Any]) -> str | None:
    """The resource class the pod's containers ask for (None: no class, or unreadable)."""
    spec = pod.get("spec")
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    for c in containers if isinstance(containers, list) else ():
        try:
            amounts = container_amounts(c if isinstance(c, Mapping) else {}, "container")
        except InvalidInput:
            continue
        for key in amounts:
            if isinstance(key, str) and key.startswith(names.CLASS_RESOURCE_PREFIX):
                return key[len(names.CLASS_RESOURCE_PREFIX):]
    return None


def pod_request(pod: Mapping[str, Any], *, as_written: bool = False) -> PodRequest:
    """The ``PodRequest`` of a v1.Pod; the key is its uid, else ``namespace/name``.
    ``as_written``: the pod as its author wrote it, before the admission webhook renamed
    a ``remote-required`` pod's ``gpupool.io/gpu`` (``remote_problem``)."""
    ns, name, uid = pod_where(pod)
    where = f"pod {ns}/{name}"
    meta = _obj(pod.get("metadata"), f"{where}: metadata")
    spec = _obj(pod.get("spec"), f"{where}: spec")
    notes = _obj(meta.get("annotations"), f"{where}: annotations")
    mode = _mode(notes.get(names.ANNOTATION_MODE), where)
    serving = serving_of(notes.get(names.ANNOTATION_PLACEMENT), where)
    cpu = mem = 0
    demands: list[GpuDemand] = []
    classes: set[str] = set()
    seen: list[str] = []
    counted: dict[str, str] = {}  # container -> the resource that counts its GPUs
    for raw in _seq(spec.get("containers"), f"{where}: spec.containers"):
        c = _obj(raw, f"{where}: a container")
        seen.append(str(c.get("name") or ""))
        here = f"{where} container {c.get('name', '?')}"
        amounts = container_amounts(c, here)
        cpu, mem = cpu + _cpu(amounts, here), mem + _memory(amounts, here)
        demand, gpu_class = _demand(amounts, mode, here, str(c.get("name") or ""))
        demands += [demand] if demand is not None else []
        classes |= {gpu_class} if gpu_class else set()
        counted.update({str(c.get("name") or ""): k for k in REMOTE_COUNTS if k in amounts})
    cpu, mem = _with_init_containers(cpu, mem, spec, where)
    if len(classes) > 1:
        raise InvalidInput(f"{where} asks for GPUs of several classes "
                           f"({', '.join(sorted(classes))}); one pod may use one class")
    if burst.asks_burst(notes):
        if not demands:
            raise InvalidInput(f"{where} sets a GPU burst limit "
                               f"({', '.join(burst.KEYS)}) but asks no gpupool GPU")
        demands = list(burst.with_limits(demands, notes, seen, where))
    problem = remote_problem(serving, demands, counted, where, as_written)
    if problem:
        raise InvalidInput(problem)
    return PodRequest(uid or f"{ns}/{name}", cpu, mem, tuple(demands),
                      group=_group(meta, where), tenant=ns,
                      affinity=_affinity(notes.get(names.ANNOTATION_AFFINITY), where),
                      gpu_class=next(iter(classes), None), serving=serving)


REMOTE_COUNTS = (names.RESOURCE_GPU, names.RESOURCE_REMOTE_GPU)
"""The two resources that count a container's GPUs: on its own node's devices, or
served by a slice server."""


def remote_problem(serving: Serving, demands: list[GpuDemand], counted: Mapping[str, str],
                   where: str, as_written: bool = False) -> str:
    """Why a pod's GPU ask and its placement cannot go together ("" when they can).
    ``counted``: per container, the resource that counts its GPUs (when it names one).

    ``gpupool.io/remote-gpu`` belongs to ``remote-required`` pods alone. A
    ``remote-required`` pod may not count its GPUs with ``gpupool.io/gpu`` once admitted
    (``as_written`` allows it: the webhook renames it), asks one GPU (one slice server per
    pod) and no MIG device."""
    remote = sorted(c for c, k in counted.items() if k == names.RESOURCE_REMOTE_GPU)
    if remote and serving is not Serving.REMOTE_REQUIRED:
        return (f"{where} container {remote[0]} asks {names.RESOURCE_REMOTE_GPU}, which only "
                f"a pod annotated {names.ANNOTATION_PLACEMENT}: "
                f"{Serving.REMOTE_REQUIRED.value} may ask (else ask {names.RESOURCE_GPU})")
    if serving is not Serving.REMOTE_REQUIRED or not demands:
        return ""
    local = sorted(c for c, k in counted.items() if k == names.RESOURCE_GPU)
    if local and not as_written:
        return (f"{where} container {local[0]} asks {names.RESOURCE_GPU}, which kube-scheduler "
                "counts against its node's own GPUs: a pod annotated "
                f"{names.ANNOTATION_PLACEMENT}: {Serving.REMOTE_REQUIRED.value} counts them as "
                f"{names.RESOURCE_REMOTE_GPU} (gpupool's admission webhook renames it)")
    if any(d.mig_profile for d in demands):
        return f"{where}: MIG devices are not served remotely (they are handed out whole)"
    if sum(d.count for d in demands) > 1:
        return (f"{where} asks {sum(d.count for d in demands)} GPUs remotely: a remote slice "
                "is one GPU of one container per pod")
    return ""


def _with_init_containers(cpu: int, mem: int, spec: Mapping[str, Any], where: str
                          ) -> tuple[int, int]:
    """The pod's CPU and memory with its init containers, as Kubernetes sums them: a
    sidecar (an init container with ``restartPolicy: Always``) runs beside everything
    started after it, so it adds to the containers' sum and to each later init
    container; other init containers run one at a time."""
    side_cpu = side_mem = peak_cpu = peak_mem = 0
    for raw in _seq(spec.get("initContainers"), f"{where}: spec.initContainers"):
        c = _obj(raw, f"{where}: an init container")
        here = f"{where} init container {c.get('name', '?')}"
        amounts = container_amounts(c, here)
        c_cpu, c_mem = _cpu(amounts, here), _memory(amounts, here)
        if c.get("restartPolicy") == "Always":
            side_cpu, side_mem = side_cpu + c_cpu, side_mem + c_mem
            c_cpu = c_mem = 0
        peak_cpu, peak_mem = max(peak_cpu, side_cpu + c_cpu), max(peak_mem, side_mem + c_mem)
    return max(cpu + side_cpu, peak_cpu), max(mem + side_mem, peak_mem)


def _group(meta: Mapping[str, Any], where: str) -> str | None:
    group = _obj(meta.get("labels"), f"{where}: labels").get(names.LABEL_GROUP)
    if group is not None and (not isinstance(group, str) or not group):
        raise InvalidInput(f"{where}: label {names.LABEL_GROUP} must be a group name")
    return group or None


def _cpu(amounts: Mapping[str, Any], where: str) -> int:
    try:
        return to_milli(amounts["cpu"]) if "cpu" in amounts else 0
    except QuantityError as exc:
        raise InvalidInput(f"{where}: cpu: {exc}") from None


def _memory(amounts: Mapping[str, Any], where: str) -> int:
    try:
        return to_mib(amounts["memory"]) if "memory" in amounts else 0
    except QuantityError as exc:
        raise InvalidInput(f"{where}: memory: {exc}") from None


def _count(amounts: Mapping[str, Any], key: str, where: str) -> int | None:
    if key not in amounts:
        return None
    try:
        return to_int(amounts[key], key)
    except QuantityError as exc:
        raise InvalidInput(f"{where}: {exc}") from None


def gpu_numbers(amounts: Mapping[str, Any], where: str) -> tuple[int | None, int, int]:
    """(``gpupool.io/gpu`` count or None when absent, GPU memory MiB, core %) of a
    container's amounts (``container_amounts``); the node agent reads the same."""
    return (_count(amounts, names.RESOURCE_GPU, where),
            _count(amounts, names.RESOURCE_MEMORY, where) or 0,
            _count(amounts, names.RESOURCE_CORE, where) or 0)


def _demand(amounts: Mapping[str, Any], mode: Mode | None, where: str, container: str
            ) -> tuple[GpuDemand | None, str | None]:
    profile, by_mig = _mig_count(amounts, where)
    if profile is not None:
        return _mig_demand(amounts, profile, by_mig or 0, mode, where, container), None
    count, memory, core = gpu_numbers(amounts, where)
    remote = _count(amounts, names.RESOURCE_REMOTE_GPU, where)
    if remote is not None and count is not None:
        raise InvalidInput(f"{where} asks both {names.RESOURCE_GPU} and "
                           f"{names.RESOURCE_REMOTE_GPU}; ask one")
    count = remote if count is None else count
    gpu_class, by_class = _class_count(amounts, where)
    if by_class is not None:
        if count is not None and count != by_class:
            raise InvalidInput(f"{where}: {names.RESOURCE_GPU}={count} disagrees with "
                               f"{names.CLASS_RESOURCE_PREFIX}{gpu_class}={by_class}")
        count = by_class
    if count == 0 and (memory or core):
        raise InvalidInput(f"{where}: {names.RESOURCE_GPU} is 0 but GPU memory or core is asked")
    if count == 0 or (count is None and not memory and not core):
        return None, None
    count = count or 1
    _check_sizes(count, memory, core, where)
    chosen = mode or (Mode.SHARED if memory or core else Mode.EXCLUSIVE)
    return GpuDemand(count, memory, core, chosen, container), gpu_class


def _mig_count(amounts: Mapping[str, Any], where: str) -> tuple[str | None, int | None]:
    """(profile, count) of the container's ``mig.gpupool.io/<profile>`` (None: none)."""
    keys = sorted(k for k in amounts if isinstance(k, str) and k.startswith(mig.RESOURCE_PREFIX))
    if not keys:
        return None, None
    if len(keys) > 1:
        raise InvalidInput(f"{where} asks MIG devices of several profiles ({', '.join(keys)}); "
                           "a container asks one profile")
    try:
        profile = mig.profile_of_resource(keys[0])
    except InvalidInput as exc:
        raise InvalidInput(f"{where}: {exc}") from None
    return profile, _count(amounts, keys[0], where)


def _mig_demand(amounts: Mapping[str, Any], profile: str, n: int, mode: Mode | None,
                where: str, container: str) -> GpuDemand | None:
    resource = mig.resource_name(profile)
    count, memory, core = gpu_numbers(amounts, where)
    if memory or core or any(isinstance(k, str) and k.startswith(names.CLASS_RESOURCE_PREFIX)
                             for k in amounts):
        raise InvalidInput(f"{where}: {resource} asks whole MIG devices; it cannot be combined "
                           f"with {names.RESOURCE_MEMORY}, {names.RESOURCE_CORE} or a class")
    if count is not None and count != n:
        raise InvalidInput(f"{where}: {names.RESOURCE_GPU}={count} disagrees with "
                           f"{resource}={n}")
    if mode is Mode.SHARED:
        raise InvalidInput(f"{where}: annotation {names.ANNOTATION_MODE}=shared, but a MIG "
                           "device is handed out whole")
    if not n:
        return None
    _check_sizes(n, 0, 0, where)
    return GpuDemand(n, mode=Mode.EXCLUSIVE, container=container, mig_profile=profile)


def _check_sizes(count: int, memory: int, core: int, where: str) -> None:
    if count > MAX_GPUS_PER_POD:
        raise InvalidInput(f"{where}: {count} GPUs asked, at most {MAX_GPUS_PER_POD} per container")
    if memory > MAX_GPU_MEMORY_MIB:
        raise InvalidInput(f"{where}: {names.RESOURCE_MEMORY}={memory} MiB per GPU is absurd "
                           "(the unit is MiB, e.g. 8192 for 8 GiB)")
    if core > CORE_UNITS_PER_GPU:
        raise InvalidInput(f"{where}: {names.RESOURCE_CORE}={core} must be 1..100 "
                           "(percent of one GPU)")


def _class_count(amounts: Mapping[str, Any], where: str) -> tuple[str | None, int | None]:
    keys = sorted(k for k in amounts if isinstance(k, str)
                  and k.startswith(names.CLASS_RESOURCE_PREFIX))
    if not keys:
        return None, None
    if len(keys) > 1:
        raise InvalidInput(f"{where} asks for several classes ({', '.join(keys)})")
    try:
        gpu_class = class_of_resource(keys[0])
    except InvalidInput as exc:
        raise InvalidInput(f"{where}: {exc}") from None
    return gpu_class, _count(amounts, keys[0], where)


def _mode(value: Any, where: str) -> Mode | None:
    if value is None or value == "":
        return None
    try:
        return Mode(str(value).strip().lower())
    except ValueError:
        raise InvalidInput(f"{where}: annotation {names.ANNOTATION_MODE}={value!r} must be "
                           "exclusive or shared") from None


def serving_of(value: Any, where: str) -> Serving:
    """The ``gpupool.io/placement`` annotation's value (absent or empty: ``local``);
    ``InvalidInput`` names the pod (``where``) and the values it may take."""
    if value is None or value == "":
        return Serving.LOCAL
    try:
        return Serving(str(value).strip().lower())
    except ValueError:
        known = ", ".join(s.value for s in Serving)
        raise InvalidInput(f"{where}: annotation {names.ANNOTATION_PLACEMENT}={value!r} must be "
                           f"one of {known}") from None


def _affinity(value: Any, where: str) -> Affinity:
    if value is None or value == "":
        return Affinity.LEAST_LOADED
    try:
        return Affinity(str(value).strip().lower())
    except ValueError:
        raise InvalidInput(f"{where}: annotation {names.ANNOTATION_AFFINITY}={value!r} must be "
                           "pod or least-loaded") from None
