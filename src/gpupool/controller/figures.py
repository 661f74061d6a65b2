"""What the controller's metrics say, worked out from one round's view: pure values.

* quota: used (and the limit, where one is set) per scope — ``group`` (limit from the
  ResourceGroup's ``spec.quota``), ``tenant`` (namespace) and ``class`` (all tenants) —
  charged with the core's ``QuotaBook`` from the decisions that count;
* GPUs per (model, pool): how many, how many healthy, the share allocated and the
  share that is free but fragmented — the core's FGD measure
  (``gpupool.core.fragmentation``) against the workload the extender would derive from
  the same allocations (``gpupool.core.policies.observed``). A node's fragmentation is
  booked to the model and pool of its first GPU. The controller does not watch nodes, so
  CPU never limits a task here (the extender's figure may be higher on CPU-bound nodes);
* pending GPU pods by reason (``pending_reason``), read from what kube-scheduler wrote
  into the pod's ``PodScheduled`` condition — the extender's counted refusals start with
  ``gpupool:`` — and, for a pod bound but refused by its node agent, the decision's
  ``failed`` phase;
* decisions not counted, by reason (signature codes come from ``VerifyTally``);
* GPUs whose node agent has gone quiet (``status.heartbeatTime``, else the object's
  creation, older than ``stale_after_s``: the extender's rule) and GPUs isolated for
  over-use, per (model, pool).

A pool is the value of the GPU label named by ``pool_label`` in the GPUDevice's
``spec.labels`` (``none`` when a GPU has none).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from gpupool.contract import annotations as records
from gpupool.contract import names
from gpupool.contract.devices import DeviceRecord, read_device
from gpupool.contract.podspec_request import pod_request
from gpupool.controller.observed import Observed, PlacedGpu, name_of
from gpupool.controller.resources import Broken, group_of
from gpupool.core.errors import GpupoolError, InvalidInput
from gpupool.core.fragmentation import FragmentationModel
from gpupool.core.model import CORE_UNITS_PER_GPU, Labels, Node
from gpupool.core.policies.observed import observed_workload
from gpupool.core.quota import Amount, Charge, Limit, QuotaBook, amount_of_allocation
from gpupool.core.state import MILLI, ClusterState

POOL_LABEL = names.LABEL_POOL
NO_POOL = "none"
ROOMY_MILLI = 10**12  # nodes' CPU and memory: the controller does not know them
PENDING_REASONS = ("waiting", "gated", "scheduler-error", "quota", "gpupool", "preempting",
                   "other", "allocation-failed")
EXTENDER_PREFIX = "gpupool: "  # how kube-scheduler's message counts the extender's reasons


@dataclass(frozen=True, slots=True)
class QuotaFigure:
    scope: str  # group | tenant | class
    name: str
    used: Amount
    limit: Limit | None = None


@dataclass(frozen=True, slots=True)
class PoolFigure:
    """GPUs of one model in one pool; shares in milli-GPU (1000 = one GPU)."""

    model: str
    pool: str
    gpus: int = 0
    healthy: int = 0
    allocated_milli: int = 0
    free_milli: int = 0
    fragmented_milli: int = 0
    stale: int = 0
    isolated: int = 0


@dataclass(frozen=True, slots=True)
class Figures:
    quotas: tuple[QuotaFigure, ...]
    pools: tuple[PoolFigure, ...]
    pending: Mapping[str, int]
    uncounted: Mapping[str, int]
    workload: str = ""  # where the fragmentation workload came from


@dataclass(frozen=True, slots=True)
class Heartbeats:
    """The GPUDevices as read (``DeviceMemo.read``), and the rule for a silent node agent."""

    devices: tuple[DeviceRecord, ...] = ()
    now_s: float = 0.0
    stale_after_s: float = 120.0


class DeviceMemo:
    """Reads GPUDevices, remembering each record by name and resourceVersion (a round
    reads again only the objects that changed since the last one)."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, str], DeviceRecord] = {}

    def read(self, objects: Iterable[Mapping[str, Any]]) -> tuple[DeviceRecord, ...]:
        """The records of ``objects`` (unreadable ones left out: they are Problems)."""
        seen: dict[tuple[str, str], DeviceRecord] = {}
        for obj in objects:
            meta = _map(obj.get("metadata"))
            key = (str(meta.get("name") or ""), str(meta.get("resourceVersion") or ""))
            record = self._known.get(key) if key[1] else None
            if record is None:
                try:
                    record = read_device(obj)
                except InvalidInput:
                    continue
            seen[key] = record
        self._known = seen
        return tuple(seen.values())


def figures(observed: Observed, pods: Iterable[Mapping[str, Any]],
            unverified: Mapping[str, int] | None = None, pool_label: str = POOL_LABEL,
            heartbeats: Heartbeats | None = None) -> Figures:
    """Every figure of one round (``unverified``: signature failures by reason)."""
    pools, source = pool_figures(observed, pool_label)
    if heartbeats is not None:
        pools = with_silence(pools, heartbeats, pool_label)
    uncounted = Counter(dict(unverified or {}))
    uncounted["not-a-gpu-pod"] += sum(1 for p in observed.problems
                                      if "asks no gpupool GPU resource" in p.message)
    return Figures(quota_figures(observed), pools, pending_figures(pods),
                   {k: v for k, v in uncounted.items() if v}, source)


# -- quota ----------------------------------------------------------------------------------------
def quota_figures(observed: Observed) -> tuple[QuotaFigure, ...]:
    book = QuotaBook()
    limits: dict[str, Limit | None] = {}
    for obj in observed.groups:
        parsed = group_of(obj, name_of(obj))
        if not isinstance(parsed, Broken):
            limits[parsed[0].name] = parsed[1]
            book.set_group_limit(parsed[0].name, parsed[1])
    by_class: dict[str, Amount] = {}
    for h in observed.holdings:
        amount = amount_of_allocation(h.allocation)
        book.charge(h.key, Charge(amount, h.tenant, h.gpu_class, h.group))
        if h.gpu_class is not None:
            by_class[h.gpu_class] = by_class.get(h.gpu_class, Amount()) + amount
    out = [QuotaFigure("group", g, book.used_by_group(g), limit)
           for g, limit in sorted(limits.items())]
    out += [QuotaFigure("tenant", t, book.used_by_tenant(t))
            for t in sorted({h.tenant for h in observed.holdings})]
    out += [QuotaFigure("class", c, a) for c, a in sorted(by_class.items())]
    return tuple(out)


# -- GPUs, allocation, fragmentation --------------------------------------------------------------
def pool_of(gpu: PlacedGpu, pool_label: str) -> str:
    return dict(gpu.gpu.labels).get(pool_label) or NO_POOL


def cluster_state(observed: Observed, labels: Mapping[str, Labels] | None = None
                  ) -> ClusterState:
    """The published GPUs with every counted allocation reserved (a decision the state
    refuses — a GPU not published, two decisions on one slice — is left out); the homes
    of remote slices served elsewhere are nodes without GPUs, so that such a slice holds
    its GPU too; ``labels``: the nodes' labels (none when not given)."""
    by_node: dict[str, list[PlacedGpu]] = {}
    for placed in observed.gpus:
        by_node.setdefault(placed.node, []).append(placed)
    for h in observed.holdings:
        by_node.setdefault(h.allocation.node, [])
    nodes = [Node(n, ROOMY_MILLI, ROOMY_MILLI,
                  tuple(replace(p.gpu, healthy=True) for p in sorted(
                      ps, key=lambda p: (p.gpu.index, p.gpu.uuid))), (labels or {}).get(n, ()))
             for n, ps in sorted(by_node.items())]
    state = ClusterState(nodes)
    with state.deferred():
        for h in observed.holdings:
            try:
                state.reserve(h.allocation)
            except GpupoolError:
                continue
    for placed in observed.gpus:
        if not placed.gpu.healthy:
            state.set_health(placed.node, placed.gpu.uuid, False)
    return state


def pool_figures(observed: Observed, pool_label: str = POOL_LABEL
                 ) -> tuple[tuple[PoolFigure, ...], str]:
    """(a figure per model and pool, where the fragmentation workload came from)."""
    if not observed.gpus:
        return (), ""
    state = cluster_state(observed)
    placed = {(p.node, p.gpu.uuid): p for p in observed.gpus}
    used = _used_milli(state)
    workload, source = observed_workload(state, [])
    model = FragmentationModel(workload)
    frag = model.measure(state.free_milli, state.cpu_free, model.access(state))
    healthy, free = state.healthy.tolist(), np.maximum(state.free_milli, 0).tolist()
    used_l, frag_l, weight = used.tolist(), frag.tolist(), max(workload.total_weight, 1)
    acc: dict[tuple[str, str], list[int]] = {}  # gpus, healthy, allocated, free, fragmented
    for i, node in enumerate(state.nodes):
        for j, gpu in enumerate(node.gpus):
            key = (gpu.model, pool_of(placed[node.name, gpu.uuid], pool_label))
            row = acc.setdefault(key, [0, 0, 0, 0, 0])
            row[0] += 1
            row[1] += healthy[i][j]
            row[2] += used_l[i][j]
            row[3] += free[i][j]
        if not node.gpus:  # the home of remote slices served elsewhere
            continue
        first = node.gpus[0]
        acc[first.model, pool_of(placed[node.name, first.uuid], pool_label)][4] += \
            frag_l[i] // weight
    return tuple(PoolFigure(*k, *acc[k]) for k in sorted(acc)), source


def _used_milli(state: ClusterState) -> Any:
    """Each GPU's allocated share: its larger used dimension (as ``ClusterState.usage``)."""
    cap_u = np.maximum(state.unit_cap, 1)
    used = np.maximum((state.core_cap - state.core_free) * MILLI // CORE_UNITS_PER_GPU,
                      -(-(state.unit_cap - state.unit_free) * MILLI // cap_u))
    return np.where(state.present, used, 0)


# -- pending pods ---------------------------------------------------------------------------------
def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def asks_gpus(pod: Mapping[str, Any]) -> bool:
    try:
        return bool(pod_request(pod).gpus)
    except InvalidInput:
        return False


def pending_reason(pod: Mapping[str, Any]) -> str | None:
    """Why a GPU pod is not running yet (one of ``PENDING_REASONS``), None when it is not
    a pending GPU pod."""
    meta, spec, status = _map(pod.get("metadata")), _map(pod.get("spec")), \
        _map(pod.get("status"))
    if status.get("phase", "Pending") != "Pending" or meta.get("deletionTimestamp") or \
            not asks_gpus(pod):
        return None
    if spec.get("nodeName"):
        notes = _map(meta.get("annotations"))
        failed = notes.get(names.ANNOTATION_PHASE) == names.PHASE_FAILED and \
            records.has_decision(notes)
        return "allocation-failed" if failed else None
    scheduled = next((c for c in status.get("conditions") or () if isinstance(c, Mapping)
                      and c.get("type") == "PodScheduled"), None)
    if scheduled is None or scheduled.get("status") != "False":
        return "waiting"
    return _refusal(str(scheduled.get("reason") or ""), str(scheduled.get("message") or ""))


def _refusal(reason: str, message: str) -> str:
    if reason == "SchedulingGated":
        return "gated"
    if reason == "SchedulerError":
        return "scheduler-error"
    if "making room" in message:
        return "preempting"
    if EXTENDER_PREFIX in message:
        return "quota" if "quota of" in message else "gpupool"
    return "other"


def pending_figures(pods: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    counts = Counter(r for r in map(pending_reason, pods) if r is not None)
    return {r: counts.get(r, 0) for r in PENDING_REASONS}


def with_silence(pools: tuple[PoolFigure, ...], beats: Heartbeats, pool_label: str
                 ) -> tuple[PoolFigure, ...]:
    """``pools`` with the stale and isolated GPUs of ``beats.devices`` counted (a GPU that
    never stopped reporting and was never isolated changes nothing)."""
    counts: dict[tuple[str, str], list[int]] = {}
    for dev in beats.devices:
        key = (dev.gpu.model, dict(dev.gpu.labels).get(pool_label) or NO_POOL)
        seen = dev.heartbeat_s if dev.heartbeat_s is not None else dev.created_s
        row = counts.setdefault(key, [0, 0])
        row[0] += seen is not None and beats.now_s - seen > beats.stale_after_s
        row[1] += dev.isolated
    acc = {(p.model, p.pool): p for p in pools}
    for key, (stale, isolated) in counts.items():
        acc[key] = replace(acc.get(key, PoolFigure(*key)), stale=stale, isolated=isolated)
    return tuple(acc[k] for k in sorted(acc))
