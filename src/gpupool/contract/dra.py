"""Dynamic Resource Allocation (``resource.k8s.io/v1``) as gpupool speaks it.

The node agent in DRA mode publishes each GPU as a device of driver ``gpu.gpupool.io``
in one ResourceSlice per node (pool = node name, device ``gpu-<NVML index>``; a GPU in
MIG mode as its MIG devices, ``gpu-<index>-mig-<profile>-<start>``, each whole), with
``capacity`` ``memory`` and ``cores`` that several claims consume (consumable
capacity); kube-scheduler allocates ResourceClaims and records the result in
``status.allocation`` (device, ``consumedCapacity``, ``shareID``). This module is the
one reader of those records, pure and shared by every component:

* ``read_slice`` / ``device_table``: the devices of ResourceSlices (or
  ``devices_of_node`` from the GPUs a component already knows: a device's name carries
  the GPU's index, so GPUDevices map claims too);
* ``read_claim``: an allocated ResourceClaim as a ``ClaimHolding`` (what it holds on
  which GPU: memory in MiB, compute in percent, whole or shared);
* ``allocation_of``: a holding as the core's ``Allocation`` (key
  ``resourceclaim/<uid>``), ready for ``ClusterState.reserve``;
* ``label_attribute``: where a GPU label is published as a device attribute, so that a
  class's label selector can be written as CEL over the attributes.

A claim that asks no capacity of a device holds it whole (gpupool's exclusive mode); one
that asks ``memory`` and/or ``cores`` holds what kube-scheduler recorded as consumed (a
dimension it did not ask is consumed whole: the slice's ``requestPolicy.default``).
Broken records raise ``InvalidInput`` naming the object and the field.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from math import ceil
from typing import Any

from gpupool.core.allocation import Allocation, Slice
from gpupool.core.errors import InvalidInput, QuantityError
from gpupool.core.mig import MigDevice
from gpupool.core.model import CORE_UNITS_PER_GPU, Gpu
from gpupool.core.quantity import parse_quantity

DRIVER = "gpu.gpupool.io"
API_VERSION = "resource.k8s.io/v1"
CAPACITY_MEMORY = "memory"
CAPACITY_CORES = "cores"
LABEL_DOMAIN = "labels.gpupool.io"
"""Attribute domain of GPU labels without a prefix (``tier`` -> ``labels.gpupool.io/tier``)."""
TAINT_UNHEALTHY = "gpu.gpupool.io/unhealthy"
"""Device taint key (effect NoSchedule) of an unhealthy GPU."""
NODE_MODE_LABEL = "gpupool.io/node-mode"
"""Node label: ``device-plugin`` (default) or ``dra`` — which path the node agent serves."""
MODE_DEVICE_PLUGIN = "device-plugin"
MODE_DRA = "dra"
CLAIM_KEY_PREFIX = "resourceclaim/"
MAX_ATTRIBUTES = 32
"""Kubernetes' limit on attributes plus capacities of one device."""

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DNS = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20),
           ("Ki", 2**10))


# -- names ---------------------------------------------------------------------------------
def slice_name(node: str) -> str:
    """The ResourceSlice of a node: ``<node>-gpu.gpupool.io``."""
    return f"{node}-{DRIVER}"[:253]


def device_name(index: int) -> str:
    """A GPU's device name in its node's pool: ``gpu-<NVML index>``."""
    return f"gpu-{index}"


def mig_device_name(index: int, device: MigDevice) -> str:
    """A MIG device's name in its node's pool: ``gpu-<index>-mig-<profile>-<start>``, the
    profile's dot a dash (``gpu-0-mig-3g-40gb-4``)."""
    return f"gpu-{index}-mig-{device.profile.replace('.', '-')}-{device.start}"


def name_of(gpu: Gpu) -> str | None:
    """The device name of a GPU or MIG device (None: a GPU in MIG mode, not a device)."""
    if isinstance(gpu.mig, MigDevice):
        return mig_device_name(gpu.index, gpu.mig)
    return None if gpu.in_mig_mode else device_name(gpu.index)


def index_of(device: str) -> int | None:
    """The GPU index a device name carries (None: not one of gpupool's names)."""
    head, _, tail = device.partition("-")
    return int(tail) if head == "gpu" and tail.isdigit() else None


def claim_key(uid: str) -> str:
    """The allocation key of a claim in the core's state."""
    return CLAIM_KEY_PREFIX + uid


def label_attribute(key: str) -> tuple[str, str] | None:
    """The (domain, identifier) a GPU label is published under, or None when it cannot be
    (identifier over 32 characters, domain over 63).

    The label's prefix is the domain (``labels.gpupool.io`` without one); the name is made a
    C identifier without collisions: ``_`` -> ``__``, ``-`` -> ``_h``, ``.`` -> ``_d``, and a
    leading digit gets a ``_`` (``nvidia.com/gpu.product`` -> ``nvidia.com/gpu_dproduct``).
    """
    prefix, _, name = key.rpartition("/")
    domain = prefix or LABEL_DOMAIN
    ident = name.replace("_", "__").replace("-", "_h").replace(".", "_d")
    if ident[:1].isdigit():
        ident = "_" + ident
    if not name or len(ident) > 32 or not _IDENT.match(ident):
        return None
    if len(domain) > 63 or not _DNS.match(domain):
        return None
    return domain, ident


def binary_quantity(mib: int) -> str:
    """MiB as the canonical quantity the API server writes back (``81920`` -> ``80Gi``)."""
    value = mib * 2**20
    for suffix, size in _BINARY:
        if value % size == 0 and value >= size:
            return f"{value // size}{suffix}"
    return str(value)


# -- slices --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DraDevice:
    """One GPU of a node's pool."""

    pool: str
    name: str
    node: str
    uuid: str
    index: int
    memory_mib: int
    tainted: bool = False  # an unhealthy GPU: NoSchedule
    model: str = "unknown"


DeviceTable = dict[tuple[str, str], DraDevice]
"""(pool, device name) -> device."""


def read_slice(obj: Mapping[str, Any]) -> list[DraDevice]:
    """The devices of one ResourceSlice of gpupool's driver ([] for another driver's)."""
    name = str(_map(obj.get("metadata")).get("name") or "?")
    spec = _map(obj.get("spec"))
    if spec.get("driver") != DRIVER:
        return []
    node, pool = spec.get("nodeName"), _map(spec.get("pool")).get("name")
    if not isinstance(node, str) or not node or not isinstance(pool, str) or not pool:
        raise InvalidInput(f"ResourceSlice {name}: spec.nodeName and spec.pool.name must be "
                           "non-empty strings")
    devices = spec.get("devices") or []
    if not isinstance(devices, list):
        raise InvalidInput(f"ResourceSlice {name}: spec.devices must be a list")
    return [_device(name, node, pool, d) for d in devices]


def _device(slice_: str, node: str, pool: str, raw: Any) -> DraDevice:
    d = _map(raw)
    dev = str(d.get("name") or "")
    where = f"ResourceSlice {slice_} device {dev or '?'}"
    attrs = _map(d.get("attributes"))
    uuid = _map(attrs.get("uuid")).get("string")
    index = _map(attrs.get("index")).get("int")
    if not dev or not isinstance(uuid, str) or not uuid or not isinstance(index, int):
        raise InvalidInput(f"{where}: needs a name and the attributes uuid (string) and "
                           "index (int)")
    memory = _quantity(_map(_map(d.get("capacity")).get(CAPACITY_MEMORY)).get("value"),
                       f"{where}: capacity memory")
    taints = d.get("taints") or []
    tainted = isinstance(taints, list) and any(
        _map(t).get("effect") in ("NoSchedule", "NoExecute") for t in taints)
    model = _map(attrs.get("model")).get("string")
    return DraDevice(pool, dev, node, uuid, index, _mib(memory), tainted,
                     model if isinstance(model, str) and model else "unknown")


def device_table(slices: Iterable[Mapping[str, Any]]) -> tuple[DeviceTable, list[str]]:
    """The devices of ``slices`` by (pool, name), and a sentence per unreadable slice."""
    table: DeviceTable = {}
    problems: list[str] = []
    for obj in slices:
        try:
            table.update({(d.pool, d.name): d for d in read_slice(obj)})
        except InvalidInput as exc:
            problems.append(str(exc))
    return table, problems


def devices_of_node(node: str, gpus: Iterable[Gpu], memory_unit_mib: int) -> DeviceTable:
    """The table a node's agent publishes, from its GPUs (as GPUDevices tell them; a GPU
    in MIG mode is no device, each of its MIG devices is one)."""
    named = [(name, g) for g in gpus for name in [name_of(g)] if name is not None]
    return {(node, name): DraDevice(
        node, name, node, g.uuid, g.index,
        g.memory_mib // memory_unit_mib * memory_unit_mib, not g.healthy, g.model)
        for name, g in named}


# -- claims --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ClaimGpu:
    """What one allocated device of a claim holds."""

    request: str
    device: DraDevice
    memory_mib: int
    core_pct: int
    whole: bool


@dataclass(frozen=True, slots=True)
class ClaimHolding:
    """An allocated ResourceClaim's GPUs (gpupool's driver only) and the pods it serves."""

    uid: str
    namespace: str
    name: str
    node: str
    gpus: tuple[ClaimGpu, ...]
    pods: tuple[str, ...] = ()  # uids of the pods in status.reservedFor

    @property
    def key(self) -> str:
        return claim_key(self.uid)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def exclusive(self) -> bool:
        return any(g.whole for g in self.gpus)


def read_claim(obj: Mapping[str, Any], devices: Mapping[tuple[str, str], DraDevice]
               ) -> ClaimHolding | None:
    """What an allocated claim holds on gpupool's GPUs; None when it is not allocated or
    holds none of them. ``InvalidInput`` names the claim and the field."""
    meta = _map(obj.get("metadata"))
    ref = f"{meta.get('namespace') or '?'}/{meta.get('name') or '?'}"
    uid = meta.get("uid")
    if not isinstance(uid, str) or not uid:
        raise InvalidInput(f"ResourceClaim {ref}: metadata.uid is missing")
    status = _map(obj.get("status"))
    results = _map(_map(status.get("allocation")).get("devices")).get("results") or []
    if not isinstance(results, list):
        raise InvalidInput(f"ResourceClaim {ref}: status.allocation.devices.results must be "
                           "a list")
    asked = _capacity_asked(obj, ref)
    gpus = tuple(_claim_gpu(ref, _map(r), devices, asked) for r in results
                 if _map(r).get("driver") == DRIVER and not _map(r).get("adminAccess"))
    if not gpus:
        return None
    nodes = {g.device.node for g in gpus}
    if len(nodes) != 1:
        raise InvalidInput(f"ResourceClaim {ref}: devices on several nodes {sorted(nodes)}")
    pods = tuple(str(_map(r).get("uid")) for r in status.get("reservedFor") or []
                 if _map(r).get("resource") == "pods" and _map(r).get("uid"))
    return ClaimHolding(uid, str(meta.get("namespace") or ""), str(meta.get("name") or ""),
                        nodes.pop(), gpus, pods)


def _capacity_asked(obj: Mapping[str, Any], ref: str) -> dict[str, bool]:
    """Request name (``req`` or ``req/sub``) -> whether it asks any capacity."""
    out: dict[str, bool] = {}
    requests = _map(_map(obj.get("spec")).get("devices")).get("requests") or []
    if not isinstance(requests, list):
        raise InvalidInput(f"ResourceClaim {ref}: spec.devices.requests must be a list")
    for raw in requests:
        req = _map(raw)
        name = str(req.get("name") or "")
        out[name] = bool(_map(_map(req.get("exactly")).get("capacity")).get("requests"))
        for sub in req.get("firstAvailable") or []:
            s = _map(sub)
            out[f"{name}/{s.get('name')}"] = bool(_map(s.get("capacity")).get("requests"))
    return out


def _claim_gpu(ref: str, result: Mapping[str, Any],
               devices: Mapping[tuple[str, str], DraDevice], asked: Mapping[str, bool]
               ) -> ClaimGpu:
    pool, dev, request = (str(result.get(k) or "") for k in ("pool", "device", "request"))
    device = devices.get((pool, dev))
    if device is None:
        raise InvalidInput(f"ResourceClaim {ref}: device {pool}/{dev} is not published by "
                           f"any {DRIVER} ResourceSlice")
    consumed = _map(result.get("consumedCapacity"))
    if not asked.get(request, False) or not consumed:
        return ClaimGpu(request, device, device.memory_mib, CORE_UNITS_PER_GPU, True)
    where = f"ResourceClaim {ref}: device {pool}/{dev} consumedCapacity"
    memory = consumed.get(CAPACITY_MEMORY)
    cores = consumed.get(CAPACITY_CORES)
    memory_mib = device.memory_mib if memory is None else _mib(_quantity(memory, where))
    core_pct = CORE_UNITS_PER_GPU if cores is None else ceil(_quantity(cores, where))
    if not 0 <= core_pct <= CORE_UNITS_PER_GPU or memory_mib > device.memory_mib:
        raise InvalidInput(f"{where}: {memory_mib} MiB and {core_pct} cores exceed the device "
                           f"({device.memory_mib} MiB, {CORE_UNITS_PER_GPU} cores)")
    return ClaimGpu(request, device, memory_mib, core_pct, False)


def allocation_of(holding: ClaimHolding, position: Callable[[str, str], int],
                  memory_unit_mib: int) -> Allocation:
    """The core's ``Allocation`` of a claim (no CPU or memory: the pods' requests count
    those). ``position(node, uuid)`` is the GPU's position on its node in the state
    (``ClusterState.gpu_position``)."""
    slices = []
    for g in holding.gpus:
        memory = -(-g.memory_mib // memory_unit_mib) * memory_unit_mib
        if g.whole:
            memory = g.device.memory_mib // memory_unit_mib * memory_unit_mib
        slices.append(Slice(g.device.uuid, position(holding.node, g.device.uuid), memory,
                            g.core_pct, g.request))
    return Allocation(holding.key, holding.node, 0, 0, tuple(slices), holding.exclusive)


def gpus_of(devices: Iterable[DraDevice]) -> tuple[Gpu, ...]:
    """The devices as core GPUs ordered by index (health from their taints)."""
    return tuple(Gpu(d.uuid, d.index, d.model, d.memory_mib, healthy=not d.tainted)
                 for d in sorted(devices, key=lambda d: d.index))


# -- helpers --------------------------------------------------------------------------------
def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _quantity(value: Any, where: str) -> Fraction:
    try:
        q = parse_quantity(value)
    except QuantityError as exc:
        raise InvalidInput(f"{where}: {exc}") from None
    if q < 0:
        raise InvalidInput(f"{where}: {value!r} is negative")
    return q


def _mib(value: Fraction) -> int:
    return ceil(value / 2**20)
