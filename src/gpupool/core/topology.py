"""How the GPUs of one node are joined, and which set of them a multi-GPU pod gets.

A ``Link`` joins two GPUs of a node: the NVLink links between them (directly or
through an NVSwitch; ``nvlinks`` 0: none) with their generation, and the PCIe path
between them, nearest first as NVML's ``nvmlGpuTopologyLevel_t`` orders it
(``PciePath``). A GPU carries its links to its peers (``Gpu.links``, peer uuid ->
``Link``); a node whose GPUs carry none has an unknown topology.

**Link quality** (``quality``; higher is better), in GB/s of one direction where
NVLink joins the pair, a small rank below any NVLink otherwise::

    NVLink:  NVLINK_FLOOR + nvlinks × GBPS_PER_LINK[generation]
    PCIe:    60 board · 50 switch · 40 switches · 30 host bridge · 20 NUMA node
             · 10 system (across sockets) · 0 unknown

**A set's quality** is (its worst pair, the sum over its pairs): the worst pair
bounds a collective (all-reduce waits for the slowest link), the sum prefers more
good pairs among sets with the same worst one.

**The choice** (``choose_set``), among the GPUs the request fits on, is the set that
minimises, in order: the number of NUMA nodes it spans (so never worse than choosing
by NUMA alone: one NUMA node whenever one has enough GPUs), then minus its quality,
then the policy's fragmentation order (the sum of the chosen GPUs' free shares,
tightest or loosest first), then the positions. Up to ``EXHAUSTIVE_SETS``
combinations are all compared; beyond that (e.g. 8 of 16 GPUs) the set is grown
greedily from each GPU in turn (the GPU that keeps the quality highest is added).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from itertools import combinations
from math import comb
from typing import TYPE_CHECKING

from gpupool.core.errors import InvalidInput

if TYPE_CHECKING:
    from gpupool.core.model import Gpu

NVLINK_FLOOR = 100
"""Every NVLink pair ranks above every PCIe pair."""

GBPS_PER_LINK = {1: 20, 2: 25, 3: 25, 4: 25, 5: 50, 6: 100}
"""GB/s of one direction of one NVLink link, by generation (P100: 1, V100: 2, A100: 3,
H100: 4, B200: 5); an unknown generation counts as 1's."""

EXHAUSTIVE_SETS = 512
"""Compare every combination up to this many; grow sets greedily beyond."""


class PciePath(IntEnum):
    """The PCIe path between two GPUs (NVML's topology levels, nearest first)."""

    BOARD = 0  # one board (dual-GPU cards)
    SWITCH = 10  # one PCIe switch (nvidia-smi: PIX)
    SWITCHES = 20  # several PCIe switches, no host bridge (PXB)
    HOST_BRIDGE = 30  # one host bridge (PHB)
    NUMA_NODE = 40  # host bridges of one NUMA node (NODE)
    SYSTEM = 50  # across sockets (SYS)
    UNKNOWN = 99  # not reported

    @property
    def spelling(self) -> str:
        """How GPUDevice objects and fake GPU files write it (``HostBridge``)."""
        return _SPELLING[self]

    @classmethod
    def parse(cls, text: str, where: str) -> PciePath:
        for path, spelled in _SPELLING.items():
            if text == spelled:
                return path
        raise InvalidInput(f"{where}: PCIe path {text!r} is not one of "
                           f"{', '.join(_SPELLING.values())}")


_SPELLING = {PciePath.BOARD: "Board", PciePath.SWITCH: "Switch", PciePath.SWITCHES: "Switches",
             PciePath.HOST_BRIDGE: "HostBridge", PciePath.NUMA_NODE: "NUMANode",
             PciePath.SYSTEM: "System", PciePath.UNKNOWN: "Unknown"}
_PCIE_QUALITY = {PciePath.BOARD: 60, PciePath.SWITCH: 50, PciePath.SWITCHES: 40,
                 PciePath.HOST_BRIDGE: 30, PciePath.NUMA_NODE: 20, PciePath.SYSTEM: 10,
                 PciePath.UNKNOWN: 0}


@dataclass(frozen=True, slots=True)
class Link:
    """How two GPUs are joined: NVLink links (0: none) and generation, and the PCIe path."""

    nvlinks: int = 0
    nvlink_version: int = 0
    pcie: PciePath = PciePath.UNKNOWN

    def __post_init__(self) -> None:
        if self.nvlinks < 0 or self.nvlink_version < 0:
            raise InvalidInput("NVLink count and generation must be >= 0")

    @property
    def quality(self) -> int:
        if self.nvlinks:
            return NVLINK_FLOOR + self.nvlinks * GBPS_PER_LINK.get(self.nvlink_version, 20)
        return _PCIE_QUALITY[self.pcie]

    def describe(self) -> str:
        """``NV12 (NVLink 3)``, ``PCIe Switch``: for people and reports."""
        if self.nvlinks:
            return f"NV{self.nvlinks} (NVLink {self.nvlink_version or '?'})"
        return f"PCIe {self.pcie.spelling}"


UNKNOWN_LINK = Link()

GpuLinks = tuple[tuple[str, Link], ...]
"""A GPU's links: (peer uuid, link), sorted by peer uuid."""


def freeze_links(links: Iterable[tuple[str, Link]]) -> GpuLinks:
    return tuple(sorted(links, key=lambda pl: pl[0]))


def link_between(a: Gpu, b: Gpu) -> Link:
    """The link ``a`` reports to ``b``, else the one ``b`` reports to ``a``, else unknown."""
    for peer, link in a.links:
        if peer == b.uuid:
            return link
    for peer, link in b.links:
        if peer == a.uuid:
            return link
    return UNKNOWN_LINK


def known(gpus: Sequence[Gpu]) -> bool:
    """Whether any GPU of the node reports a link (else the node's topology is unknown)."""
    return any(g.links for g in gpus)


def quality_matrix(gpus: Sequence[Gpu]) -> list[list[int]]:
    """``[p][q]``: the quality of the link between positions ``p`` and ``q``."""
    n = len(gpus)
    out = [[0] * n for _ in range(n)]
    for p in range(n):
        for q in range(p + 1, n):
            out[p][q] = out[q][p] = link_between(gpus[p], gpus[q]).quality
    return out


def set_quality(positions: Sequence[int], matrix: Sequence[Sequence[int]]) -> tuple[int, int]:
    """(worst pair, sum over pairs) of a set of positions; (0, 0) for fewer than two."""
    pairs = [matrix[p][q] for p, q in combinations(positions, 2)]
    return (min(pairs), sum(pairs)) if pairs else (0, 0)


def worst_link(gpus: Sequence[Gpu], positions: Sequence[int]) -> Link | None:
    """The weakest link among the GPUs at ``positions`` (None for fewer than two)."""
    links = [link_between(gpus[p], gpus[q]) for p, q in combinations(positions, 2)]
    return min(links, key=lambda link: link.quality) if links else None


def cliques(gpus: Sequence[Gpu], joined: Callable[[Link], bool]) -> dict[str, int]:
    """GPU uuid -> its group: the lowest index of a set of GPUs every two of which
    ``joined`` accepts the link of, grown in index order (each GPU in one group). Empty
    when the node's topology is unknown. (DRA's ``matchAttribute`` groups.)"""
    if not known(gpus):
        return {}
    groups: list[list[Gpu]] = []
    for g in sorted(gpus, key=lambda g: g.index):
        home = next((grp for grp in groups
                     if all(joined(link_between(g, m)) for m in grp)), None)
        if home is None:
            groups.append([g])
        else:
            home.append(g)
    return {g.uuid: grp[0].index for grp in groups for g in grp}


SetKey = Callable[[Sequence[int]], tuple[int, ...]]


def choose_set(candidates: Sequence[int], count: int, gpus: Sequence[Gpu],
               fragmentation: Callable[[Sequence[int]], int]) -> list[int]:
    """``count`` of ``candidates`` (positions on one node) by NUMA span, link quality,
    then ``fragmentation`` (lower first), then positions (the module's rule)."""
    matrix = quality_matrix(gpus)

    def key(ps: Sequence[int]) -> tuple[int, ...]:
        worst, total = set_quality(ps, matrix)
        return (len({gpus[p].numa_node for p in ps}), -worst, -total, fragmentation(ps),
                *sorted(ps))

    if comb(len(candidates), count) <= EXHAUSTIVE_SETS:
        best = min(combinations(sorted(candidates), count), key=key)
    else:
        best = min((_grown(seed, candidates, count, key) for seed in candidates), key=key)
    return sorted(best, key=lambda p: candidates.index(p))


def _grown(seed: int, candidates: Sequence[int], count: int, key: SetKey) -> tuple[int, ...]:
    chosen = [seed]
    while len(chosen) < count:
        rest = [p for p in candidates if p not in chosen]
        chosen.append(min(rest, key=lambda p: key([*chosen, p])))
    return tuple(sorted(chosen))
