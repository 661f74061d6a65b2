"""Boards for the trace's nodes, and the link quality of multi-GPU placements.

The Alibaba trace names a node's GPU model and count, not how its GPUs are joined, so
``board`` gives each (model, count) the board such servers are built as (an assumption,
documented in docs/benchmarks.md, "Multi-GPU placement by link quality"):

* 8 × V100 (``V100M16``, ``V100M32``): the DGX-1V hybrid cube-mesh, NVLink 2 with one
  or two links per joined pair, the rest across sockets;
* 4 × V100: one NVLink 2 quad, two links per pair;
* 8 × ``G2`` / ``G3`` (models the trace does not name; PCIe servers assumed): per
  socket, two PCIe switches of two GPUs under one upper switch (``PIX`` within a
  switch, ``PXB`` across the two), ``SYS`` across sockets;
* 4 × T4: two GPUs per PCIe switch, one switch per socket;
* 2 × T4 or P100: one PCIe switch; one GPU: no pairs.

NUMA nodes are those ``uniform_node`` gives (the first half of the GPUs on NUMA 0 from
four GPUs up). ``link_run`` replays the FGD protocol (``protocol``) once with the nodes
as today's core sees them (no links: NUMA first, then packing) or with their boards
(links first among NUMA-equal sets), and grades every multi-GPU placement by the
weakest link of its GPUs *on the board* either way, so the two runs are compared on the
same hardware.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from gpupool.core import topology
from gpupool.core.model import Gpu, Node
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.state import ClusterState
from gpupool.core.topology import Link, PciePath
from gpupool.sim.decision import Decider
from gpupool.sim.protocol import arrival_order, node_order
from gpupool.sim.scenario import Scenario, demand_milli

Pair = Callable[[int, int], Link]

_SYS, _PIX, _PXB = (Link(pcie=p) for p in (PciePath.SYSTEM, PciePath.SWITCH,
                                           PciePath.SWITCHES))
HYBRID_CUBE_MESH = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2,
    (2, 3): 2, (2, 6): 1, (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2,
    (5, 7): 1, (6, 7): 2}
"""The DGX-1V's NVLink links per GPU pair (``nvidia-smi topo -m``)."""

CLASSES = ("NVLink", "PCIe switch", "PCIe switches", "host bridge or NUMA node",
           "across sockets", "unknown")
"""How a placement is graded: its weakest link's kind."""


def _mesh(p: int, q: int) -> Link:
    n = HYBRID_CUBE_MESH.get((min(p, q), max(p, q)))
    return Link(n, 2, PciePath.SYSTEM) if n else _SYS


def _pcie_pairs(p: int, q: int) -> Link:
    if p // 4 != q // 4:
        return _SYS
    return _PIX if p // 2 == q // 2 else _PXB


def _t4_quad(p: int, q: int) -> Link:
    return _PIX if p // 2 == q // 2 else _SYS


BOARDS: dict[tuple[str, int], Pair] = {
    ("V100M16", 8): _mesh, ("V100M32", 8): _mesh,
    ("V100M16", 4): lambda p, q: Link(2, 2, PciePath.NUMA_NODE if p // 2 == q // 2
                                      else PciePath.SYSTEM),
    ("V100M32", 4): lambda p, q: Link(2, 2, PciePath.NUMA_NODE if p // 2 == q // 2
                                      else PciePath.SYSTEM),
    ("G2", 8): _pcie_pairs, ("G3", 8): _pcie_pairs, ("T4", 4): _t4_quad,
    ("T4", 2): lambda p, q: _PIX, ("P100", 2): lambda p, q: _PIX}
"""(trace model, GPU count) -> the link between two GPU positions of such a node."""


def board(node: Node) -> Node:
    """``node`` with its GPUs' links, by its model and GPU count (unchanged if unknown)."""
    pair = BOARDS.get((node.model, len(node.gpus)))
    if pair is None or len(node.gpus) < 2:
        return node
    gpus = tuple(dataclasses.replace(g, links=topology.freeze_links(
        (o.uuid, pair(g.index, o.index)) for o in node.gpus if o.uuid != g.uuid))
        for g in node.gpus)
    return dataclasses.replace(node, gpus=gpus)


def grade(link: Link) -> str:
    """The class of ``CLASSES`` a weakest link falls in."""
    if link.nvlinks:
        return "NVLink"
    return {PciePath.BOARD: "PCIe switch", PciePath.SWITCH: "PCIe switch",
            PciePath.SWITCHES: "PCIe switches", PciePath.HOST_BRIDGE: "host bridge or NUMA node",
            PciePath.NUMA_NODE: "host bridge or NUMA node",
            PciePath.SYSTEM: "across sockets"}.get(link.pcie, "unknown")


@dataclass(frozen=True, slots=True)
class Graded:
    """One multi-GPU placement: its GPUs, its weakest link's class and NVLink GB/s (0
    without NVLink), and how many NUMA nodes it spans."""

    gpus: int
    grade: str
    nvlink_gbps: int
    numa_nodes: int


@dataclass(frozen=True, slots=True)
class LinkRun:
    """One protocol run graded by link quality."""

    aware: bool
    seed: int
    unallocated_gpu_pct: float  # the protocol's headline (packing)
    failed_pods: int
    placements: tuple[Graded, ...] = ()  # every multi-GPU pod placed, in arrival order

    def of_size(self, gpus: int) -> list[Graded]:
        return [g for g in self.placements if g.gpus == gpus]

    def share(self, gpus: int, grade: str) -> float:
        mine = self.of_size(gpus)
        return 100.0 * sum(g.grade == grade for g in mine) / max(len(mine), 1)

    def mean_gbps(self, gpus: int) -> float:
        mine = self.of_size(gpus)
        return sum(g.nvlink_gbps for g in mine) / max(len(mine), 1)


def link_run(scenario: Scenario, policy: str, seed: int, inflate: float,
             config: PolicyConfig, aware: bool) -> LinkRun:
    """The protocol's run of ``seed``; the core sees links only when ``aware``."""
    nodes = node_order(scenario, seed)
    boards = {n.name: board(n) for n in nodes}
    state = ClusterState([boards[n.name] if aware else n for n in nodes])
    capacity = state.usage().capacity_milli
    order = arrival_order(list(scenario.requests), capacity, inflate, random.Random(seed))
    full = int(np.searchsorted(np.cumsum([demand_milli(r) for r in order]), capacity))
    decider = Decider(state, policy, config, seed, scenario.classes)
    graded: list[Graded] = []
    failed, headline = 0, 0.0
    for i, request in enumerate(order):
        allocation = decider.decide(request, i)
        if allocation is None:
            failed += 1
        else:
            state.reserve(allocation)
            positions = sorted({s.gpu_position for s in allocation.slices})
            if len(positions) >= 2:
                graded.append(_graded(boards[allocation.node].gpus, positions))
        if i == min(full, len(order) - 1):
            headline = 100.0 - 100.0 * state.usage().allocated_milli / capacity
    return LinkRun(aware, seed, round(headline, 4), failed, tuple(graded))


def _graded(gpus: Sequence[Gpu], positions: Sequence[int]) -> Graded:
    weakest = _weakest(gpus, positions)
    gbps = weakest.quality - topology.NVLINK_FLOOR if weakest.nvlinks else 0
    return Graded(len(positions), grade(weakest), gbps,
                  len({gpus[p].numa_node for p in positions}))


def _weakest(gpus: Sequence[Gpu], positions: Sequence[int]) -> Link:
    return min((topology.link_between(gpus[p], gpus[q]) for p, q in combinations(positions, 2)),
               key=lambda link: link.quality)
