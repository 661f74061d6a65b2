"""What the cluster cache keeps of each pod it watches (``PodSummary`` or ``Pod`` models).

A pod holds resources on its node from the moment it is bound until it is
deleted (it is *leaving* from its deletionTimestamp until it is gone) or reaches
``Succeeded``/``Failed``: its CPU and memory requests (so
the core sees what is left of the node), and — when gpupool placed it — the
GPU slices its ``gpupool.io/allocation`` annotation records. A decision whose
phase the node agent set to ``failed`` holds nothing, and neither does one the
cache's ``DecisionFilter`` does not vouch for (unsigned, forged, copied, edited, or on
a pod that asks no gpupool GPU resource): such a pod holds its CPU and memory only.
A pod's gang (its PodGroup, or its ``gpupool.io/gang`` label and what it says of its gang)
is kept too (``contract.gangs``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from gpupool.contract import annotations as records
from gpupool.contract import names
from gpupool.contract.gangs import GangRef, GangTerms, gang_ref, label_terms
from gpupool.contract.slices import SliceState, read_status
from gpupool.contract.tenancy import Broken
from gpupool.core.allocation import Allocation
from gpupool.core.errors import InvalidInput, QuantityError
from gpupool.core.model import Labels, freeze_labels
from gpupool.core.quantity import to_mib, to_milli
from gpupool.core.quota import Charge, amount_of_allocation

log = logging.getLogger(__name__)

TERMINAL_PHASES = names.POD_TERMINAL_PHASES
GPU_RESOURCES = frozenset({names.RESOURCE_GPU, names.RESOURCE_MEMORY, names.RESOURCE_CORE,
                           names.RESOURCE_REMOTE_GPU})

DecisionFilter = Callable[[str, str, str, Mapping[str, str], Allocation, bool], bool]
"""(uid, namespace, name, annotations, decision, asks a GPU) -> may the decision count?"""


def no_decisions(uid: str, namespace: str, name: str, notes: Mapping[str, str],
                 decision: Allocation, asks_gpu: bool) -> bool:
    """The filter of a reader without keys: no recorded decision counts."""
    return False


@dataclass(frozen=True, slots=True)
class PodFacts:
    uid: str
    namespace: str
    name: str
    node: str
    terminal: bool
    cpu_milli: int
    memory_mib: int
    decision: Allocation | None
    gpu_class: str | None
    group: str | None
    asks_gpu: bool = False
    priority: int = 0  # spec.priority (the API server sets it from priorityClassName)
    leaving: bool = False  # being deleted (deletionTimestamp set)
    labels: Labels = ()  # kept for pods with a counted decision (disruption budgets)
    bound_s: float = 0.0  # its signed bind time (epoch seconds; 0: none), for "youngest first"
    slice_lost: str = ""  # a remote slice's node the controller found its server lost on
    gang: GangRef | None = None  # its PodGroup or gpupool.io/gang (docs/gangs.md)
    gang_terms: GangTerms | Broken | None = None  # what a labelled gang's member says

    def held(self) -> Allocation:
        """What the pod holds on its node (its decision, or just CPU and memory)."""
        if self.decision is not None:
            return self.decision
        return Allocation(self.uid, self.node, self.cpu_milli, self.memory_mib)

    def charge(self) -> Charge | None:
        if self.decision is None:
            return None
        return Charge(amount_of_allocation(self.decision), self.namespace, self.gpu_class,
                      self.group)


def facts_of(pod: Any, counts: DecisionFilter = no_decisions) -> PodFacts:
    """What the cache keeps of ``pod``; its decision only if ``counts`` vouches for it."""
    meta, spec, status = pod.metadata, pod.spec, pod.status
    uid = meta.uid or f"{meta.namespace}/{meta.name}"
    ns, name = meta.namespace or "default", meta.name or ""
    notes = meta.annotations or {}
    node = (spec.nodeName if spec is not None else None) or ""
    cpu, mem, gpu_class, asks_gpu = _load(spec)
    phase = status.phase if status is not None else None
    decision = _decision(uid, notes, node)
    if decision is not None and not counts(uid, ns, name, notes, decision, asks_gpu):
        decision = None
    priority = getattr(spec, "priority", None) if spec is not None else None
    group = getattr(spec, "schedulingGroup", None) if spec is not None else None
    gang = gang_ref(ns, meta.labels, getattr(group, "podGroupName", None))
    return PodFacts(uid, ns, name, node, phase in TERMINAL_PHASES, cpu, mem, decision,
                    gpu_class, records.group_of(notes, meta.labels), asks_gpu,
                    priority if isinstance(priority, int) else 0,
                    meta.deletionTimestamp is not None,
                    freeze_labels(meta.labels) if decision is not None else (),
                    _bound_s(notes) if decision is not None else 0.0,
                    _lost_on(notes) if decision is not None and decision.served_by else "",
                    gang, label_terms(gang, notes) if gang is not None and not gang.native
                    else None)


def _lost_on(notes: Mapping[str, str]) -> str:
    """The node a remote slice's server was lost (or failed) on, by the controller's
    ``gpupool.io/slice-status`` ("" when it serves, or says nothing)."""
    status = read_status(notes)
    lost = status is not None and status.state in (SliceState.LOST, SliceState.FAILED)
    return status.node if lost and status is not None else ""


def _bound_s(notes: Mapping[str, str]) -> float:
    """The decision's bind time in seconds (0 when it cannot be read)."""
    text = notes.get(names.ANNOTATION_BIND_TIME) or ""
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _decision(uid: str, notes: dict[str, str], node: str) -> Allocation | None:
    try:
        return records.holding(uid, notes, node)
    except InvalidInput as exc:
        log.warning("ignoring a broken decision: %s", exc)
        return None


def _load(spec: Any) -> tuple[int, int, str | None, bool]:
    """(CPU milli, memory MiB, class, asks a gpupool GPU resource) of the pod's requests:
    containers summed, init max; any container or init container asking ``gpupool.io/gpu``,
    ``gpu-memory``, ``gpu-core`` or a class makes it a GPU pod (as kube-scheduler decides
    which pods reach the extender)."""
    if spec is None:
        return 0, 0, None, False
    cpu = mem = 0
    gpu_class = None
    asks = False
    for c in spec.containers or ():
        c_cpu, c_mem, c_class, c_asks = _container(c)
        cpu, mem, gpu_class = cpu + c_cpu, mem + c_mem, gpu_class or c_class
        asks = asks or c_asks
    for c in spec.initContainers or ():
        c_cpu, c_mem, _, c_asks = _container(c)
        cpu, mem = max(cpu, c_cpu), max(mem, c_mem)
        asks = asks or c_asks
    return cpu, mem, gpu_class, asks


@lru_cache(maxsize=4096)
def _milli(text: Any) -> int:
    return to_milli(text)


@lru_cache(maxsize=4096)
def _mib(text: Any) -> int:
    return to_mib(text)


def _container(c: Any) -> tuple[int, int, str | None, bool]:
    res = c.resources
    if res is None:
        return 0, 0, None, False
    amounts = {**(res.limits or {}), **(res.requests or {})}  # requests win, as in the scheduler
    gpu_class = next((k[len(names.CLASS_RESOURCE_PREFIX):] for k in amounts
                      if k.startswith(names.CLASS_RESOURCE_PREFIX)), None)
    asks = gpu_class is not None or not GPU_RESOURCES.isdisjoint(amounts)
    try:
        cpu = _milli(amounts["cpu"]) if "cpu" in amounts else 0  # few distinct strings
        mem = _mib(amounts["memory"]) if "memory" in amounts else 0
    except QuantityError:
        return 0, 0, gpu_class, asks
    return cpu, mem, gpu_class, asks
