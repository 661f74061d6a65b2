"""Generated workloads: the published trace mix, bent one way at a time.

A *mix* (``WorkloadMix``) names how a workload differs from the published
marginals of the Alibaba trace that ``gpupool.sim.synthetic`` draws from: the
pod counts per GPU request class, the GPU shares of sharing pods, how much CPU
and memory pods ask, and which share of GPU pods accept only some GPU models
(and which). Every mix runs on the published 1,213-node cluster
(``synthetic_nodes(1213)``, identical to the trace's node list), so it needs no
trace file; ``cpu_nodes`` adds nodes without GPUs in the published proportions of the
trace's 310 (``CPU_NODE_TYPES``), and ``zones`` deals the nodes round-robin into that
many zones (``topology.kubernetes.io/zone``: ``zone-0``, ...) for remote slices to
prefer (``gpupool.sim.remote``). The mixes gpupool is measured on are in ``mixes.yaml`` beside this
module (``gpupool simulate --mix NAME``); ``--mixes FILE`` reads your own.

A mix file::

    mixes:
      - name: spec-scarce-20
        about: 20 % of GPU pods accept only a scarce model
        constrained: 0.20                  # share of GPU pods with a model list
        models: {T4: 45, P100: 20, "V100M16|V100M32": 20, G3: 15}   # list: weight
        classes: {cpu-only: 1088, gpu-share: 3078, one-gpu: 3911,
                  two-gpu: 16, four-gpu: 15, eight-gpu: 44}           # pods (weights)
        shares: {810: 1078, 470: 750}      # gpu_milli of a sharing pod: weight
        cpu_scale: 1.0                     # CPU of every pod × this
        memory_scale: 1.0                  # memory of every pod × this
        pods: 8152
        seed: 2023
        cpu_nodes: 310                     # nodes without GPUs (published: 310)
        zones: 4                           # topology zones (default 0: no zone label)

Every key but ``name`` is optional; an absent key keeps the published figure.
A pod's CPU and memory are capped at the largest node's, and a multi-GPU pod
draws only among the model lists that have a node with that many GPUs, so every
pod fits somewhere on an empty cluster. Errors name the file and the entry.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpupool.core.errors import InvalidInput
from gpupool.core.model import Node, freeze_labels, uniform_node
from gpupool.core.request import GpuDemand, Mode, PodRequest
from gpupool.core.serving import ZONE_LABEL
from gpupool.sim import native
from gpupool.sim.native_schema import MIXES
from gpupool.sim.scenario import Scenario, TracePod
from gpupool.sim.synthetic import (
    CPU_MILLI_LADDER,
    GIB,
    GPU_CLASSES,
    MEMORY_MIB_LADDER,
    NODE_TYPES,
    SHARE_MILLI,
    TRACE_NODES,
    TRACE_PODS,
    WORKLOAD_SEED,
    apportion,
    draw,
    synthetic_nodes,
)

MIXES_FILE = Path(__file__).with_name("mixes.yaml")
"""The mixes gpupool's packing figures are measured on (docs/benchmarks.md)."""
CLASS_GPUS = {name: gpus for name, gpus, _ in GPU_CLASSES}
KEYS = frozenset({"name", "about", "constrained", "models", "classes", "shares", "cpu_scale",
                  "memory_scale", "pods", "seed", "cpu_nodes", "zones"})
MAX_PODS = 1_000_000
MAX_EXTRA_NODES = 100_000
CPU_NODE_TYPES: tuple[tuple[int, int, int], ...] = (
    # (cores, memory GiB, nodes) of the 310 nodes without GPUs in the trace's all-node list
    (32, 64, 10), (32, 128, 23), (32, 256, 129), (64, 128, 4), (64, 256, 8), (64, 512, 22),
    (96, 384, 30), (96, 512, 59), (96, 768, 1), (104, 192, 1), (104, 512, 20), (104, 768, 3),
)


@dataclass(frozen=True, slots=True)
class WorkloadMix:
    """How a generated workload differs from the published trace mix."""

    name: str
    about: str = ""
    constrained: float = 0.0  # share of GPU pods that accept only some GPU models
    models: tuple[tuple[frozenset[str], float], ...] = ()  # the lists they accept: weight
    classes: tuple[tuple[str, float], ...] = tuple((n, float(c)) for n, _, c in GPU_CLASSES)
    shares: tuple[tuple[int, float], ...] = tuple((m, float(w)) for m, w in SHARE_MILLI)
    cpu_scale: float = 1.0
    memory_scale: float = 1.0
    pods: int = TRACE_PODS
    seed: int = WORKLOAD_SEED
    cpu_nodes: int = 0  # nodes without GPUs at the published scale (1,213 GPU nodes)
    zones: int = 0  # topology zones the nodes are dealt into (0: no zone label)
    caps: tuple[int, int] = field(default=(0, 0), compare=False)  # largest node's CPU, memory
    widest: tuple[tuple[str, int], ...] = field(default=(), compare=False)  # GPUs per node

    def __post_init__(self) -> None:
        if not 0.0 <= self.constrained <= 1.0:
            raise InvalidInput(f"mix {self.name}: constrained must be within 0..1")
        if self.constrained > 0 and not self.models:
            raise InvalidInput(f"mix {self.name}: constrained pods need a models list")
        if not 0 < self.pods <= MAX_PODS:
            raise InvalidInput(f"mix {self.name}: pods must be within 1..{MAX_PODS}")
        for what, count in (("cpu_nodes", self.cpu_nodes), ("zones", self.zones)):
            if not 0 <= count <= MAX_EXTRA_NODES:
                raise InvalidInput(f"mix {self.name}: {what} must be within "
                                   f"0..{MAX_EXTRA_NODES}")
        if self.cpu_scale <= 0 or self.memory_scale <= 0:
            raise InvalidInput(f"mix {self.name}: cpu_scale and memory_scale must be > 0")
        for what, table in (("classes", self.classes), ("shares", self.shares),
                            ("models", self.models)):
            if table and (any(w < 0 for _, w in table) or not sum(w for _, w in table)):
                raise InvalidInput(f"mix {self.name}: {what} weights must be >= 0, "
                                   "not all zero")

    def request(self, k: int, rng: random.Random) -> PodRequest:
        """Pod ``k`` of the workload."""
        kind = rng.choices([c for c, _ in self.classes], weights=[w for _, w in self.classes])[0]
        count = CLASS_GPUS[kind]
        gpus: tuple[GpuDemand, ...] = ()
        if kind == "gpu-share":
            milli = rng.choices([m for m, _ in self.shares],
                                weights=[w for _, w in self.shares])[0]
            gpus = (GpuDemand(1, core_pct=-(-milli // 10), mode=Mode.SHARED),)
        elif count:
            gpus = (GpuDemand(count, mode=Mode.EXCLUSIVE),)
        cpu = min(round(draw(CPU_MILLI_LADDER, rng) * self.cpu_scale), self.caps[0])
        memory = min(round(draw(MEMORY_MIB_LADDER, rng) * self.memory_scale), self.caps[1])
        models = self.models_for(count, rng) if gpus and rng.random() < self.constrained \
            else None
        return PodRequest(f"{self.name}-{k:06d}", cpu, memory, gpus, models)

    def models_for(self, count: int, rng: random.Random) -> frozenset[str] | None:
        """A model list for a pod of ``count`` GPUs, among the lists some node of which has
        that many GPUs (None when no list can hold it: the pod stays unconstrained)."""
        widest = dict(self.widest)
        lists = [(m, w) for m, w in self.models if max(widest.get(x, 0) for x in m) >= count]
        if not lists:
            return None
        return rng.choices([m for m, _ in lists], weights=[w for _, w in lists])[0]


def scenario(mix: WorkloadMix, nodes: int = TRACE_NODES) -> Scenario:
    """The mix's workload on the trace's node-type mix at ``nodes`` nodes (default: the
    published cluster); ``mix.pods`` and ``mix.cpu_nodes`` are scaled with the node count."""
    cluster = zoned(synthetic_nodes(nodes)
                    + cpu_only_nodes(round(mix.cpu_nodes * nodes / TRACE_NODES)), mix.zones)
    _check_models(mix, cluster)
    caps = (max(n.cpu_milli for n in cluster), max(n.memory_mib for n in cluster))
    widest: dict[str, int] = {}
    for n in cluster:
        widest[n.model] = max(widest.get(n.model, 0), len(n.gpus))
    sized = WorkloadMix(**{**_fields(mix), "caps": caps, "widest": tuple(sorted(widest.items()))})
    rng = random.Random(mix.seed)
    count = max(1, round(mix.pods * nodes / TRACE_NODES))
    pods = tuple(TracePod(sized.request(k, rng)) for k in range(count))
    return Scenario(f"mix-{mix.name}", tuple(cluster), pods)


def cpu_only_nodes(count: int) -> list[Node]:
    """``count`` nodes without GPUs in the proportions of the trace's 310."""
    out: list[Node] = []
    for (cores, gib, _), n in zip(CPU_NODE_TYPES, apportion(count, [t[2] for t in
                                                                  CPU_NODE_TYPES]), strict=True):
        out += [uniform_node(f"cpu-node-{len(out) + k:04d}", cores * 1000, gib * GIB, 0, "", 1)
                for k in range(n)]
    return out


def zoned(nodes: list[Node], zones: int) -> list[Node]:
    """``nodes`` dealt round-robin into ``zones`` zones (0: as they are)."""
    if not zones:
        return nodes
    return [replace(n, labels=freeze_labels({**dict(n.labels), ZONE_LABEL: f"zone-{k % zones}"}))
            for k, n in enumerate(nodes)]


def _fields(mix: WorkloadMix) -> dict[str, Any]:
    return {name: getattr(mix, name) for name in WorkloadMix.__dataclass_fields__}


def _check_models(mix: WorkloadMix, cluster: list[Node]) -> None:
    known = {n.model for n in cluster}
    for models, _ in mix.models:
        if not models & known:
            raise InvalidInput(f"mix {mix.name}: no node has a GPU of model "
                               f"{'|'.join(sorted(models))} (known: {', '.join(sorted(known))})")


# -- the mix file -------------------------------------------------------------------------
def read_mixes(path: Path = MIXES_FILE) -> dict[str, WorkloadMix]:
    """The mixes of a mix file, by name (in file order)."""
    where = native._Where(Path(path))
    doc = native.load(Path(path), MIXES)
    out: dict[str, WorkloadMix] = {}
    for i, entry in enumerate(where.items(doc.get("mixes"))):
        mix = _mix(where / "mixes" / i, where.mapping(entry))
        if mix.name in out:
            raise (where / "mixes" / i).error(f"mix {mix.name!r} appears twice")
        out[mix.name] = mix
    if not out:
        raise where.error("no mixes (expected a 'mixes' list)")
    return out


def find_mix(name: str, path: Path = MIXES_FILE) -> WorkloadMix:
    mixes = read_mixes(path)
    if name not in mixes:
        raise InvalidInput(f"{path}: no mix named {name!r}; known: {', '.join(mixes)}")
    return mixes[name]


def _mix(where: native._Where, spec: Mapping[str, Any]) -> WorkloadMix:
    unknown = sorted(set(spec) - KEYS)
    if unknown:
        raise where.error(f"unknown key {unknown[0]!r} (known: {', '.join(sorted(KEYS))})")
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise where.error("a mix needs a name")
    kwargs: dict[str, Any] = {"name": name, "about": str(spec.get("about") or "")}
    for key in ("constrained", "cpu_scale", "memory_scale"):
        if key in spec:
            kwargs[key] = _number(where / key, spec[key])
    for key in ("pods", "seed", "cpu_nodes", "zones"):
        if key in spec:
            kwargs[key] = int(_number(where / key, spec[key], whole=True))
    if "classes" in spec:
        kwargs["classes"] = _table(where / "classes", spec["classes"], _class_name)
    if "shares" in spec:
        kwargs["shares"] = _table(where / "shares", spec["shares"], _share)
    if "models" in spec:
        kwargs["models"] = _table(where / "models", spec["models"], _models)
    try:
        return WorkloadMix(**kwargs)
    except InvalidInput as exc:
        raise where.error(str(exc)) from None


def _number(where: native._Where, value: object, whole: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            whole and not float(value).is_integer()):
        raise where.error(f"expected {'a whole number' if whole else 'a number'}, "
                          f"got {value!r}")
    return float(value)


def _table(where: native._Where, value: object, key: Any) -> tuple[tuple[Any, float], ...]:
    items = where.mapping(value)
    return tuple((key(where / str(k), k), _number(where / str(k), w)) for k, w in items.items())


def _class_name(where: native._Where, name: object) -> str:
    if name not in CLASS_GPUS:
        raise where.error(f"unknown GPU request class (known: {', '.join(CLASS_GPUS)})")
    return str(name)


def _share(where: native._Where, milli: object) -> int:
    if isinstance(milli, bool) or not isinstance(milli, int) or not 1 <= milli <= 999:
        raise where.error("a sharing pod's gpu_milli must be a whole number within 1..999")
    return milli


def _models(where: native._Where, spec: object) -> frozenset[str]:
    names = frozenset(m for m in str(spec).split("|") if m)
    if not names:
        raise where.error("empty model list")
    unknown = sorted(names - {t.model for t in NODE_TYPES})
    if unknown:
        raise where.error(f"unknown GPU model {unknown[0]!r} (the trace's: "
                          f"{', '.join(sorted({t.model for t in NODE_TYPES}))})")
    return names
