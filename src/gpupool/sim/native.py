"""gpupool's own YAML format for clusters and workloads (see docs/simulator.md).

One file may hold ``nodes`` (and ``classes``), ``pods``, or both. Quantities
are Kubernetes quantities (``cpu: 8`` or ``500m``; ``memory: 32Gi``); times are
seconds. ``replicas: N`` repeats an entry, with ``{i}`` in its name replaced by
0..N-1. Every error names the file, the line and the entry
(``workload.yaml:12: pods[3].containers[0]: ...``).

A container asks GPUs as a Pod's container does (``gpupool.contract.podspec_request``):
``gpu: N`` GPUs, whole unless ``gpuMemory`` or ``gpuCore`` asks a slice of each; a slice
without ``gpu`` is on one GPU; a container that names none of the three, or ``gpu: 0``,
asks no GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gpupool.contract.yamlcheck import KIND_WORDS, Shape
from gpupool.core.classes import ResourceClass
from gpupool.core.errors import GpupoolError, InvalidInput
from gpupool.core.model import Gpu, Node, freeze_labels
from gpupool.core.quantity import to_int, to_mib, to_milli
from gpupool.core.request import MAX_GPUS_PER_POD, Affinity, GpuDemand, Mode, PodRequest
from gpupool.core.selector import Selector
from gpupool.sim.native_schema import NATIVE, loaded_text
from gpupool.sim.scenario import TracePod

MAX_REPLICAS = 100_000


class _Where:
    """Location inside a document, for error messages: the entry's path and, once known
    (``on``), its line."""

    def __init__(self, path: Path, at: str = "", line: int | None = None):
        self.path, self.at, self.line = path, at, line

    def __truediv__(self, part: str | int) -> _Where:
        step = f"[{part}]" if isinstance(part, int) else (f".{part}" if self.at else part)
        return _Where(self.path, self.at + step, self.line)

    def on(self, spec: object, key: str | None = None) -> _Where:
        """This place at the line of ``spec`` (a map as read: ``Marked``), or of its
        ``key``."""
        lines: Mapping[Any, int] = getattr(spec, "lines", {})
        line = (lines.get(key) if key is not None else None) or getattr(spec, "line", None)
        return _Where(self.path, self.at, line or self.line)

    def error(self, message: str) -> InvalidInput:
        file = f"{self.path}:{self.line}" if self.line else str(self.path)
        return InvalidInput(f"{file}: {self.at or 'document'}: {message}")

    def mapping(self, value: object) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.error(f"expected a map, got {_kind(value)}")
        return value

    def items(self, value: object) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.error(f"expected a list, got {_kind(value)}")
        return value


def _kind(value: object) -> str:
    """What a YAML value is, in the words of the file's checks (``KIND_WORDS``)."""
    names = {type(None): "null", bool: "bool", int: "int", float: "float", str: "str",
             list: "list"}
    return KIND_WORDS.get(names.get(type(value), ""), type(value).__name__)


def load(path: Path, shape: Shape = NATIVE) -> Mapping[str, Any]:
    """The YAML document at ``path`` as a map (every key checked against ``shape``)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        doc = loaded_text(text, str(path), shape)
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror or exc}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{path}: not valid YAML ({exc})".replace("\n", " ")) from None
    if doc is None:
        raise InvalidInput(f"{path}: empty (no YAML document, only blank lines or "
                           f"comments); expected a map with {_keys(shape)}")
    return _Where(path).mapping(doc)


def _keys(shape: Shape) -> str:
    """The keys a file of ``shape`` is expected to start with, for a user."""
    if shape is NATIVE:
        return "nodes: and/or pods:"
    return " or ".join(f"{k}:" for k in getattr(shape, "fields", {})) or "keys"


def _field(where: _Where, spec: Mapping[str, Any], key: str, parse: Any, default: Any) -> Any:
    """``parse(spec[key])``, or ``default`` when absent; any bad value names its place."""
    if key not in spec or spec[key] is None:
        return default
    try:
        return parse(spec[key])
    except GpupoolError as exc:
        raise (where / key).on(spec, key).error(str(exc)) from None
    except (TypeError, ValueError) as exc:
        raise (where / key).on(spec, key).error(f"bad value {spec[key]!r} ({exc})") from None


def _seconds(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"must be a number of seconds, got {value!r}")
    return float(value)


def _labels(value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise InvalidInput("labels must be a map of strings")
    return {str(k): str(v) for k, v in value.items()}


def _expand(where: _Where, spec: Mapping[str, Any]) -> list[str]:
    """Names of an entry's replicas."""
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise (where / "name").on(spec, "name").error("every entry needs a name")
    count = _field(where, spec, "replicas", lambda v: to_int(v, "replicas"), 1)
    if not 1 <= count <= MAX_REPLICAS:
        raise (where / "replicas").on(spec, "replicas").error(
            f"must be 1..{MAX_REPLICAS}, got {count}")
    if count == 1:
        return [name.replace("{i}", "0") if "{i}" in name else name]
    if "{i}" not in name:
        raise (where / "name").on(spec, "name").error("a name with replicas > 1 must contain {i}")
    return [name.replace("{i}", str(i)) for i in range(count)]


# -- clusters ------------------------------------------------------------------------------
def read_cluster(path: Path) -> tuple[list[Node], list[ResourceClass]]:
    """Nodes and resource classes of a native YAML file."""
    doc, where = load(path), _Where(Path(path))
    nodes: list[Node] = []
    for k, spec in enumerate((where / "nodes").items(doc.get("nodes"))):
        nodes.extend(_nodes(where / "nodes" / k, spec))
    if not nodes:
        raise (where / "nodes").error("no nodes")
    dup = _first_duplicate([n.name for n in nodes])
    if dup is not None:
        raise (where / "nodes").error(f"node {dup} appears twice")
    classes = [_resource_class(where / "classes" / k, c)
               for k, c in enumerate((where / "classes").items(doc.get("classes")))]
    return nodes, classes


def _nodes(where: _Where, raw: object) -> list[Node]:
    spec = where.mapping(raw)
    where = where.on(spec)
    cpu = _field(where, spec, "cpu", to_milli, None)
    memory = _field(where, spec, "memory", to_mib, None)
    if cpu is None or memory is None:
        raise where.error("a node needs cpu and memory")
    labels = freeze_labels(_field(where, spec, "labels", _labels, {}))
    out = []
    for name in _expand(where, spec):
        gpus = _gpus(where / "gpus", spec.get("gpus"), name)
        numa = 2 if len(gpus) >= 4 else 1
        try:
            out.append(Node(name, cpu, memory, gpus, labels, numa))
        except GpupoolError as exc:
            raise where.error(str(exc)) from None
    return out


def _gpus(where: _Where, raw: object, node: str) -> tuple[Gpu, ...]:
    if raw is None:
        return ()
    if isinstance(raw, Mapping):
        count = _field(where, raw, "count", lambda v: to_int(v, "count"), 1)
        specs = [raw] * count
    else:
        specs = where.items(raw)
    numa = 2 if len(specs) >= 4 else 1
    return tuple(_gpu(where / i if not isinstance(raw, Mapping) else where, s, node, i,
                      (i * numa) // max(len(specs), 1)) for i, s in enumerate(specs))


def _gpu(where: _Where, raw: object, node: str, index: int, numa: int) -> Gpu:
    spec = where.mapping(raw)
    where = where.on(spec)
    model = spec.get("model")
    if not isinstance(model, str) or not model:
        raise (where / "model").on(spec, "model").error("every GPU needs a model")
    memory = _field(where, spec, "memory", to_mib, None)
    if memory is None:
        raise (where / "memory").error("every GPU needs its memory (e.g. 16Gi)")
    try:
        return Gpu(f"GPU-{node}-{index}", index, model, memory, numa,
                   bool(spec.get("healthy", True)),
                   freeze_labels(_field(where, spec, "labels", _labels, {})))
    except GpupoolError as exc:
        raise where.error(str(exc)) from None


def _resource_class(where: _Where, raw: object) -> ResourceClass:
    spec = where.mapping(raw)
    where = where.on(spec)
    try:
        selector = Selector.from_spec(where.mapping(spec.get("selector") or {}))
        return ResourceClass(str(spec.get("name", "")), selector)
    except GpupoolError as exc:
        raise where.error(str(exc)) from None


# -- workloads -----------------------------------------------------------------------------
def read_workload(path: Path) -> list[TracePod]:
    """Pods of a native YAML file, in file order."""
    doc, where = load(path), _Where(Path(path))
    pods: list[TracePod] = []
    for k, spec in enumerate((where / "pods").items(doc.get("pods"))):
        pods.extend(_pods(where / "pods" / k, spec))
    if not pods:
        raise (where / "pods").error("no pods")
    dup = _first_duplicate([p.request.key for p in pods])
    if dup is not None:
        raise (where / "pods").error(f"pod {dup} appears twice")
    return pods


def _first_duplicate(names: list[str]) -> str | None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            return name
        seen.add(name)
    return None


def _pods(where: _Where, raw: object) -> list[TracePod]:
    spec = where.mapping(raw)
    where = where.on(spec)
    listed = (where / "containers").on(spec, "containers").items(spec.get("containers"))
    asked = (_container(where / "containers" / k, c) for k, c in enumerate(listed))
    containers = tuple(d for d in asked if d is not None)
    models = _field(where, spec, "models", _models, None)
    selector = _field(where, spec, "selector", lambda v: Selector.from_spec(where.mapping(v)),
                      None)
    affinity = _field(where, spec, "affinity", Affinity, Affinity.LEAST_LOADED)
    gpu_class = _field(where, spec, "class", str, None)
    cpu = _field(where, spec, "cpu", to_milli, 0)
    memory = _field(where, spec, "memory", to_mib, 0)
    created = _field(where, spec, "creation", _seconds, None)
    deleted = _field(where, spec, "deletion", _seconds, None)
    if created is not None and deleted is not None and deleted < created:
        raise (where / "deletion").on(spec, "deletion").error(
            f"{deleted} is before creation {created}")
    out = []
    for name in _expand(where, spec):
        try:
            request = PodRequest(name, cpu, memory, containers, models, selector,
                                 affinity=affinity, gpu_class=gpu_class)
        except GpupoolError as exc:
            raise where.error(str(exc)) from None
        out.append(TracePod(request, created, deleted))
    return out


def _models(value: object) -> frozenset[str]:
    if isinstance(value, str):
        value = value.split("|")
    if not isinstance(value, list) or not all(isinstance(m, str) and m for m in value):
        raise InvalidInput("models must be a list of GPU model names")
    return frozenset(value)


def _container(where: _Where, raw: object) -> GpuDemand | None:
    """The container's GPU demand, or None when it asks no GPU (module docstring)."""
    spec = where.mapping(raw)
    where = where.on(spec)
    count = _field(where, spec, "gpu", lambda v: to_int(v, "gpu"), None)
    memory = _field(where, spec, "gpuMemory", to_mib, 0)
    core = _field(where, spec, "gpuCore", lambda v: to_int(v, "gpuCore"), 0)
    if count == 0 and (memory or core):
        raise (where / "gpu").on(spec, "gpu").error(
            "is 0 but gpuMemory or gpuCore is asked (a container that asks no GPU names "
            "none of the three, or gpu: 0 alone)")
    if not count and not memory and not core:
        if spec.get("mode") is not None:
            raise (where / "mode").on(spec, "mode").error(
                "a container that asks no GPU has no mode (give gpu, gpuMemory or gpuCore)")
        return None
    if count is not None and count > MAX_GPUS_PER_POD:
        raise (where / "gpu").on(spec, "gpu").error(
            f"must be 0..{MAX_GPUS_PER_POD}, got {count}")
    default = Mode.SHARED if memory or core else Mode.EXCLUSIVE
    mode = _field(where, spec, "mode", Mode, default)
    try:
        return GpuDemand(count or 1, memory, core, mode, str(spec.get("name", "")))
    except GpupoolError as exc:
        raise where.error(str(exc).removeprefix("container ?: ")) from None
