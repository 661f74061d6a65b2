"""How the node's GPUs are joined, from NVML (nvidia-ml-py): ``core.topology.Link``s.

For every GPU, every NVLink link ``l`` below ``NVML_NVLINK_MAX_LINKS``:
``nvmlDeviceGetNvLinkState`` (active or not; ``NVML_ERROR_NOT_SUPPORTED`` or
``NVML_ERROR_INVALID_ARGUMENT``: the GPU has no more links), then for an active link
``nvmlDeviceGetNvLinkRemoteDeviceType`` (a GPU or an NVSwitch),
``nvmlDeviceGetNvLinkRemotePciInfo`` (which GPU, by PCI bus id) and
``nvmlDeviceGetNvLinkVersion``. Two GPUs are joined by the links that run between them
directly; GPUs with links to NVSwitches are joined through them when
``nvmlDeviceGetP2PStatus(…, NVML_P2P_CAPS_INDEX_NVLINK)`` answers OK, by as many links
as the one with fewer has (``nvidia-smi topo -m``'s ``NV18`` on an HGX H100).

Every pair's PCIe path is ``nvmlDeviceGetTopologyCommonAncestor`` (NVML's levels
are ``PciePath``'s values). An NVML error on one query leaves that fact unknown
(``PciePath.UNKNOWN``, no NVLink); the GPU is still served.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import pynvml

from gpupool.core.topology import GpuLinks, Link, PciePath, freeze_links

log = logging.getLogger(__name__)

_NO_MORE_LINKS = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT)


@dataclass
class NvLinks:
    """One GPU's active NVLink links: to GPUs (by bus id) and to NVSwitches."""

    to_gpu: Counter[str] = field(default_factory=Counter)
    to_switch: int = 0
    version: int = 0


def bus_id(value: str | bytes) -> str:
    """A PCI bus id in one spelling: ``00000000:3B:00.0`` -> ``0000:3b:00.0``."""
    text = (value.decode() if isinstance(value, bytes) else str(value)).strip().lower()
    domain, _, rest = text.partition(":")
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return text


def links(handles: Mapping[str, Any], buses: Mapping[str, str]) -> dict[str, GpuLinks]:
    """GPU uuid -> its links to every other GPU of ``handles`` (uuid -> NVML handle);
    ``buses``: uuid -> ``bus_id``."""
    by_bus = {bus: uuid for uuid, bus in buses.items()}
    nv = {uuid: nvlinks(h) for uuid, h in handles.items()}
    out: dict[str, list[tuple[str, Link]]] = {u: [] for u in handles}
    for a, b in combinations(sorted(handles), 2):
        link = _pair(a, b, handles, nv, by_bus)
        out[a].append((b, link))
        out[b].append((a, link))
    return {u: freeze_links(ls) for u, ls in out.items()}


def nvlinks(handle: Any) -> NvLinks:
    found = NvLinks()
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            if pynvml.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                continue
        except pynvml.NVMLError as exc:
            if exc.value not in _NO_MORE_LINKS:
                log.info("NVLink %d not read: %s", link, exc)
            break
        try:
            _count(found, handle, link)
        except pynvml.NVMLError as exc:
            log.info("NVLink %d not read: %s", link, exc)
    return found


def _count(found: NvLinks, handle: Any, link: int) -> None:
    try:
        kind = pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
    except pynvml.NVMLError as exc:
        if exc.value not in NOT_KNOWN:
            raise
        kind = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU  # older drivers: told by the bus id
    found.version = max(found.version, int(pynvml.nvmlDeviceGetNvLinkVersion(handle, link)))
    if kind == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
        found.to_switch += 1
        return
    remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
    found.to_gpu[bus_id(remote.busId)] += 1


NOT_KNOWN = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)


def _pair(a: str, b: str, handles: Mapping[str, Any], nv: Mapping[str, NvLinks],
          by_bus: Mapping[str, str]) -> Link:
    direct = sum(n for bus, n in nv[a].to_gpu.items() if by_bus.get(bus) == b) or \
        sum(n for bus, n in nv[b].to_gpu.items() if by_bus.get(bus) == a)
    count = direct or _through_switch(handles[a], handles[b], nv[a], nv[b])
    version = _generation(max(nv[a].version, nv[b].version)) if count else 0
    return Link(count, version, _pcie(handles[a], handles[b]))


def _through_switch(ha: Any, hb: Any, a: NvLinks, b: NvLinks) -> int:
    if not a.to_switch or not b.to_switch:
        return 0
    try:
        ok = pynvml.nvmlDeviceGetP2PStatus(ha, hb, pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
    except pynvml.NVMLError as exc:
        log.info("NVLink peer status not read: %s", exc)
        return 0
    return min(a.to_switch, b.to_switch) if ok == pynvml.NVML_P2P_STATUS_OK else 0


def _pcie(ha: Any, hb: Any) -> PciePath:
    try:
        level = int(pynvml.nvmlDeviceGetTopologyCommonAncestor(ha, hb))
    except pynvml.NVMLError as exc:
        log.info("PCIe path not read: %s", exc)
        return PciePath.UNKNOWN
    try:
        return PciePath(level)
    except ValueError:
        return PciePath.UNKNOWN


_GENERATIONS = {
    pynvml.NVML_NVLINK_VERSION_1_0: 1, pynvml.NVML_NVLINK_VERSION_2_0: 2,
    pynvml.NVML_NVLINK_VERSION_2_2: 2, pynvml.NVML_NVLINK_VERSION_3_0: 3,
    pynvml.NVML_NVLINK_VERSION_3_1: 3, pynvml.NVML_NVLINK_VERSION_4_0: 4,
    pynvml.NVML_NVLINK_VERSION_5_0: 5, pynvml.NVML_NVLINK_VERSION_6_0: 6}


def _generation(version: int) -> int:
    """NVML's ``nvmlNvlinkVersion_t`` (3.1 is 5) -> the NVLink generation (3)."""
    return _GENERATIONS.get(version, 0)
