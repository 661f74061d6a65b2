"""FAKE GPU file, the board: topology, make and telemetry of the GPUs it describes.

Read by ``fakegpus`` (the fake GPU driver) from the file's validated body:

* ``topology``: a matrix in ``nvidia-smi topo -m``'s words, row and column ``i`` for the
  GPU of index ``i``: ``X`` on the diagonal, ``NV<n>`` (``n`` NVLink links, generation
  ``nvlinkVersion``), ``PIX`` (one PCIe switch), ``PXB`` (several switches), ``PHB`` (a
  host bridge), ``NODE`` (host bridges of one NUMA node), ``SYS`` (across sockets),
  ``BOARD`` (one board); symmetric;
* a GPU's ``facts`` (its make) and ``telemetry`` (what the next health reading returns).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from gpupool.contract.yamlcheck import FLAG, NUMBER, TEXT, WHOLE, Map, Seq
from gpupool.core.errors import InvalidInput
from gpupool.core.topology import GpuLinks, Link, PciePath, freeze_links
from gpupool.nodeagent.gpu import GpuFacts
from gpupool.nodeagent.health import CLOCK_EVENTS, GpuReading

WORDS = {"BOARD": PciePath.BOARD, "PIX": PciePath.SWITCH, "PXB": PciePath.SWITCHES,
         "PHB": PciePath.HOST_BRIDGE, "NODE": PciePath.NUMA_NODE, "SYS": PciePath.SYSTEM}
_NV = re.compile(r"^NV([1-9][0-9]?)$")
_CLOCKS = Map({"graphics": WHOLE, "sm": WHOLE, "memory": WHOLE})
FACTS = Map({"computeCapability": TEXT, "maxClocksMHz": _CLOCKS, "powerLimitW": WHOLE,
             "pcie": Map({"generation": WHOLE, "width": WHOLE}), "driverVersion": TEXT,
             "cudaVersion": TEXT})
TELEMETRY = Map({
    "temperatureC": WHOLE, "powerW": NUMBER, "clocksMHz": _CLOCKS, "fanPct": WHOLE,
    "eccVolatileCorrected": WHOLE, "eccVolatileUncorrected": WHOLE,
    "eccAggregateCorrected": WHOLE, "eccAggregateUncorrected": WHOLE,
    "retiredPagesPending": FLAG, "remappedRowsPending": FLAG, "remappingFailed": FLAG,
    "clockEvents": Seq(TEXT), "pcieReplays": WHOLE, "lost": FLAG, "unsupported": Seq(TEXT)})
TOPOLOGY = Seq(Seq(TEXT))
"""The shapes ``fakegpus.FAKE_GPU_FILE`` checks these keys against."""


def links(matrix: Any, uuids: Sequence[str], version: int, where: str) -> dict[str, GpuLinks]:
    """GPU uuid (by index) -> its links, from the ``topology`` matrix (None: no links)."""
    if matrix is None:
        return {}
    n = len(uuids)
    if not isinstance(matrix, list) or len(matrix) != n or \
            not all(isinstance(row, list) and len(row) == n for row in matrix):
        raise InvalidInput(f"{where}: topology must be {n} rows of {n} entries, one per GPU "
                           "in index order")
    out: dict[str, list[tuple[str, Link]]] = {u: [] for u in uuids}
    for i in range(n):
        if matrix[i][i] != "X":
            raise InvalidInput(f"{where}: topology[{i}][{i}] must be X (the GPU itself)")
        for j in range(i + 1, n):
            if matrix[i][j] != matrix[j][i]:
                raise InvalidInput(f"{where}: topology[{i}][{j}] is {matrix[i][j]!r} but "
                                   f"topology[{j}][{i}] is {matrix[j][i]!r}: it must be "
                                   "symmetric")
            link = _link(str(matrix[i][j]), version, f"{where}: topology[{i}][{j}]")
            out[uuids[i]].append((uuids[j], link))
            out[uuids[j]].append((uuids[i], link))
    return {u: freeze_links(ls) for u, ls in out.items()}


def _link(word: str, version: int, where: str) -> Link:
    nv = _NV.match(word)
    if nv is not None:
        return Link(int(nv.group(1)), version)
    if word not in WORDS:
        raise InvalidInput(f"{where}: {word!r} is not one of NV<links>, "
                           f"{', '.join(WORDS)}")
    return Link(pcie=WORDS[word])


def facts(entry: Mapping[str, Any]) -> GpuFacts:
    f = entry.get("facts") or {}
    clocks, pcie = f.get("maxClocksMHz") or {}, f.get("pcie") or {}
    return GpuFacts(str(f.get("computeCapability", "")), int(clocks.get("graphics", 0)),
                    int(clocks.get("sm", 0)), int(clocks.get("memory", 0)),
                    int(f.get("powerLimitW", 0)), int(pcie.get("generation", 0)),
                    int(pcie.get("width", 0)), str(f.get("driverVersion", "")),
                    str(f.get("cudaVersion", "")))


def reading(entry: Mapping[str, Any], where: str) -> GpuReading:
    """What NVML would read of the GPU now, from its ``telemetry``."""
    t = entry.get("telemetry") or {}
    clocks = t.get("clocksMHz") or {}
    bits = {name: bit for bit, (name, _) in CLOCK_EVENTS.items()}
    unknown = [e for e in t.get("clockEvents") or () if e not in bits]
    if unknown:
        raise InvalidInput(f"{where}: GPU {entry.get('uuid')}: clock events {unknown} are not "
                           f"among {', '.join(bits)}")
    return GpuReading(
        str(entry["uuid"]), bool(t.get("lost", False)), "",
        t.get("eccVolatileCorrected"), t.get("eccVolatileUncorrected"),
        t.get("eccAggregateCorrected"), t.get("eccAggregateUncorrected"),
        t.get("retiredPagesPending"), t.get("remappedRowsPending"), t.get("remappingFailed"),
        sum(bits[e] for e in t.get("clockEvents") or ()) if "clockEvents" in t else None,
        t.get("pcieReplays"), t.get("temperatureC"), t.get("powerW"), clocks.get("graphics"),
        clocks.get("sm"), clocks.get("memory"), t.get("fanPct"),
        tuple(str(u) for u in t.get("unsupported") or ()))
