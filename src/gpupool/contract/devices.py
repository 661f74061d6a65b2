"""The ``GPUDevice`` object as a value: the one reader of what the node agent publishes.

The extender (its cluster cache) and the controller (its status and quota
views) both read GPUDevices; they read them here, by the rules of the CRD
(``deploy/crds/gpudevices.yaml``, ``docs/protocol.md``), so that a device one of
them takes in is never refused by the other:

* ``spec.node`` and ``spec.uuid``: non-empty strings;
* ``spec.index``: a whole number ≥ 0; ``spec.memoryMiB``: a whole number ≥ 1;
* ``spec.model``: a string ("unknown" when absent or empty); ``spec.numaNode``: a
  whole number ≥ 0 (0 when absent); ``spec.architecture``: a string, also offered to
  class selectors as the label ``gpupool.io/architecture``;
* ``spec.labels``: a map (values read as strings);
* ``spec.links``: absent, or a list of ``{peer, nvlinks, nvlinkVersion, pcie}`` — how the
  GPU is joined to each other GPU of its node (``peer``: its uuid; ``nvlinks`` and
  ``nvlinkVersion``: whole numbers, 0 without NVLink; ``pcie``: a ``PciePath`` spelling,
  ``Switch``, ``System``, ...), read into ``Gpu.links`` (``gpupool.core.topology``);
* ``spec.mig``: absent, or MIG (``contract.mig``): a GPU in MIG mode, never handed out
  itself, or one of its MIG devices, read into ``Gpu.mig``;
* ``status.health``: ``Healthy`` unless it says otherwise; ``status.heartbeatTime``
  and ``metadata.creationTimestamp``: RFC 3339 (unreadable times count as absent);
* ``status.isolation``: absent, or ``{state: Isolated | None, reason, pods}`` — the node
  agent isolates a GPU whose container uses more than its slice; an isolated GPU keeps
  its holders but takes no new placements (``takes_placements``) until it is released;
* ``status.isolationProvider``: how slices are enforced on the GPU (``mps``,
  ``hami-core`` or ``none``: advisory), for people and metrics.

Anything else raises ``InvalidInput`` naming the object and the field. Whether a
GPU counts as healthy (the reported health, and for the extender a recent
heartbeat) is the reader's rule: the record keeps the facts and a ``Gpu`` marked
healthy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeGuard

from gpupool.contract import names
from gpupool.contract.mig import read_mig
from gpupool.core.errors import InvalidInput
from gpupool.core.model import Gpu, freeze_labels
from gpupool.core.topology import GpuLinks, Link, PciePath, freeze_links

ARCHITECTURE_LABEL = "gpupool.io/architecture"


@dataclass(frozen=True, slots=True)
class DeviceRecord:
    """What a GPUDevice says (``heartbeat_s`` and ``created_s``: epoch seconds or None)."""

    name: str
    node: str
    gpu: Gpu
    reported_healthy: bool
    heartbeat_s: float | None
    created_s: float | None
    isolated: bool = False
    isolation_reason: str = ""

    @property
    def takes_placements(self) -> bool:
        """Whether new slices may be placed on the GPU (by its own report): healthy and not
        isolated. Readers add their own staleness rule."""
        return self.reported_healthy and not self.isolated


def parse_time(text: Any) -> float | None:
    """RFC 3339 -> epoch seconds (None when absent or unreadable)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def read_device(obj: Mapping[str, Any]) -> DeviceRecord:
    """The record of a GPUDevice (a decoded JSON object); ``InvalidInput`` names the object
    and the field that breaks the CRD's rules."""
    meta = _map(obj.get("metadata"))
    name = str(meta.get("name") or "?")
    spec, status = obj.get("spec"), obj.get("status")
    if not isinstance(spec, Mapping) or not isinstance(status, Mapping | None):
        raise InvalidInput(f"GPUDevice {name}: spec and status must be objects")
    status = status or {}
    node, uuid = _text(spec, "node", name), _text(spec, "uuid", name)
    index, memory = spec.get("index"), spec.get("memoryMiB")
    if not _whole(index) or not _whole(memory) or memory < 1:
        raise InvalidInput(f"GPUDevice {name}: spec.index and spec.memoryMiB must be whole "
                           f"numbers (memoryMiB at least 1), got {index!r} and {memory!r}")
    model, numa = spec.get("model") or "unknown", spec.get("numaNode", 0)
    if not isinstance(model, str):
        raise InvalidInput(f"GPUDevice {name}: spec.model must be a string, got {model!r}")
    if not _whole(numa):
        raise InvalidInput(f"GPUDevice {name}: spec.numaNode must be a whole number, "
                           f"got {numa!r}")
    labels = spec.get("labels") or {}
    if not isinstance(labels, Mapping):
        raise InvalidInput(f"GPUDevice {name}: spec.labels must be a map of strings")
    labels = {str(k): str(v) for k, v in labels.items()}
    arch = spec.get("architecture")
    if isinstance(arch, str) and arch:
        labels = {ARCHITECTURE_LABEL: arch, **labels}
    gpu = Gpu(uuid, index, model, memory, numa, True, freeze_labels(labels),
              read_links(spec.get("links"), f"GPUDevice {name}: spec.links"),
              read_mig(spec.get("mig"), f"GPUDevice {name}: spec.mig"))
    healthy = status.get("health", names.DEVICE_HEALTHY) == names.DEVICE_HEALTHY
    isolation = _map(status.get("isolation"))
    isolated = isolation.get("state") == names.DEVICE_ISOLATED
    return DeviceRecord(name, node, gpu, healthy,
                        parse_time(status.get("heartbeatTime")),
                        parse_time(meta.get("creationTimestamp")), isolated,
                        str(isolation.get("reason") or "") if isolated else "")


def read_links(value: Any, where: str) -> GpuLinks:
    """``spec.links`` (or a fake GPU file's ``links``) -> ``Gpu.links``; ``InvalidInput``
    names the entry and the field."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidInput(f"{where} must be a list")
    out = []
    for i, entry in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(entry, Mapping):
            raise InvalidInput(f"{at} must be an object")
        peer, nvlinks, version = entry.get("peer"), entry.get("nvlinks", 0), \
            entry.get("nvlinkVersion", 0)
        if not isinstance(peer, str) or not peer:
            raise InvalidInput(f"{at}.peer must be a GPU uuid")
        if not _whole(nvlinks) or not _whole(version):
            raise InvalidInput(f"{at}: nvlinks and nvlinkVersion must be whole numbers >= 0, "
                               f"got {nvlinks!r} and {version!r}")
        pcie = entry.get("pcie", PciePath.UNKNOWN.spelling)
        if not isinstance(pcie, str):
            raise InvalidInput(f"{at}.pcie must be a string, got {pcie!r}")
        out.append((peer, Link(nvlinks, version, PciePath.parse(pcie, f"{at}.pcie"))))
    return freeze_links(out)


def links_spec(links: GpuLinks) -> list[dict[str, Any]]:
    """``Gpu.links`` as ``spec.links`` (what ``read_links`` reads)."""
    return [{"peer": peer, "nvlinks": link.nvlinks, "nvlinkVersion": link.nvlink_version,
             "pcie": link.pcie.spelling} for peer, link in links]


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _text(spec: Mapping[str, Any], field: str, name: str) -> str:
    value = spec.get(field)
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"GPUDevice {name}: spec.{field} must be a non-empty string")
    return value


def _whole(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
