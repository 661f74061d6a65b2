"""What the controller sees, as values: GPUs from GPUDevices, decisions from pods.

The raw objects (decoded JSON dicts) are kept for the custom resources the
controller writes (their ``status`` and ``metadata`` are compared with what it
wants); GPUDevices and pods are translated here once, at the edge. A broken
GPUDevice or pod never stops the controller: it becomes a ``Problem`` that
names the object and what is wrong with it.

A pod's decision counts only if the pod asks a gpupool GPU resource and the decision's
signature verifies for that pod (``Verify``: the extender signed it for this uid,
namespace, name, node and allocation). Anything else is a ``Problem`` saying why, and
holds nothing: a pod author who writes a decision, copies one, or edits one cannot
make the controller charge a GPU to anyone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from gpupool.contract import annotations as records
from gpupool.contract import names
from gpupool.contract.devices import read_device
from gpupool.contract.podspec_request import gpu_class_of, pod_request
from gpupool.core.allocation import Allocation
from gpupool.core.errors import InvalidInput
from gpupool.core.model import Gpu, Labels

Obj = dict[str, Any]

TERMINAL_PHASES = names.POD_TERMINAL_PHASES

Verify = Callable[[str, str, str, Mapping[str, str], "str | None"], str]
"""``(uid, namespace, name, annotations, signature) -> key id``, raising ``InvalidInput``
(``SignatureError``) when the decision was not signed by gpupool for that pod
(``gpupool.kube.keystore.KeyRingSource.verify``)."""


class NotCounted(InvalidInput):
    """A decision that holds nothing: unsigned, forged, copied, or on a pod asking no GPU."""


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
    bound_s: float = 0.0  # its signed bind time (epoch seconds; 0 when unreadable)
    priority: int = 0  # spec.priority


@dataclass(frozen=True, slots=True)
class Tenancy:
    """TenantQuota and GPUPermission objects (raw) and the nodes' labels, as listed: what
    MIG on demand checks a pod's quota and permissions against (``migplanner``)."""

    quotas: tuple[Obj, ...] = ()
    permissions: tuple[Obj, ...] = ()
    node_labels: Mapping[str, Labels] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Observed:
    """One consistent view of the cluster, as the controller reconciles it."""

    gpus: tuple[PlacedGpu, ...]
    classes: tuple[Obj, ...]  # ResourceClass objects, raw
    groups: tuple[Obj, ...]  # ResourceGroup objects, raw
    holdings: tuple[PodHolding, ...]
    problems: tuple[Problem, ...] = ()
    unreadable_pods: tuple[tuple[Obj, str], ...] = ()  # (pod, why) of broken decisions
    tenancy: Tenancy | None = None  # None: not every kind of it listed yet


def name_of(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("name") or "") if isinstance(meta, Mapping) else ""


def gpu_of_device(obj: Mapping[str, Any]) -> PlacedGpu:
    """The GPU a GPUDevice publishes, healthy as its status reports (read by the
    contract's reader, as the extender reads it); ``InvalidInput`` names the field."""
    dev = read_device(obj)
    gpu = dev.gpu if dev.reported_healthy else replace(dev.gpu, healthy=False)
    return PlacedGpu(dev.node, gpu)


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def holding_of(pod: Mapping[str, Any], verify: Verify | None = None) -> PodHolding | None:
    """What a pod holds (None: nothing — no decision, finished, or a failed decision).

    A decision that does not count raises ``NotCounted`` (``verify`` None: signatures
    are not checked, the unsafe opt-out); one that cannot be read, ``InvalidInput``.
    """
    meta = _map(pod.get("metadata"))
    notes = _map(meta.get("annotations"))
    if not records.has_decision(notes) or \
            _map(pod.get("status")).get("phase") in TERMINAL_PHASES:
        return None
    ns, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
    key = str(meta.get("uid") or f"{ns}/{name}")
    text = {str(k): str(v) for k, v in notes.items()}
    _check_counts(pod, ns, name, str(meta.get("uid") or ""), text, verify)
    held = records.holding(key, text, _map(pod.get("spec")).get("nodeName"))
    if held is None:
        return None
    priority = _map(pod.get("spec")).get("priority")
    return PodHolding(key, f"{ns}/{name}", ns, gpu_class_of(pod),
                      records.group_of(notes, meta.get("labels")), held,
                      _seconds(text.get(names.ANNOTATION_BIND_TIME, "")),
                      priority if isinstance(priority, int) and
                      not isinstance(priority, bool) else 0)


def _seconds(stamp: str) -> float:
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _check_counts(pod: Mapping[str, Any], ns: str, name: str, uid: str,
                  notes: Mapping[str, str], verify: Verify | None) -> None:
    """Raise ``NotCounted`` unless the pod asks a gpupool GPU and its decision verifies."""
    try:
        asks = bool(pod_request(pod).gpus)
    except InvalidInput as exc:
        raise NotCounted(f"its decision is not counted: its GPU request cannot be read "
                         f"({exc})") from None
    if not asks:
        raise NotCounted("its decision is not counted: the pod asks no gpupool GPU resource")
    if verify is None:
        return
    try:
        verify(uid, ns, name, notes, notes.get(names.ANNOTATION_SIGNATURE))
    except InvalidInput as exc:
        raise NotCounted(f"its decision is not counted: {exc}") from None


def observe(devices: Iterable[Mapping[str, Any]], classes: Iterable[Mapping[str, Any]],
            groups: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
            verify: Verify | None = None) -> Observed:
    """Translate listed objects into an ``Observed`` (never raises on a broken object);
    ``verify`` checks each decision's signature (None: not checked)."""
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
            held = holding_of(pod, verify)
        except NotCounted as exc:
            problems.append(Problem("Pod", _pod_name(pod), str(exc)))
            continue
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
