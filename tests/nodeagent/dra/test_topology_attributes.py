"""Topology groups as device attributes, so that ``matchAttribute`` can keep a claim's GPUs
on one NVLink clique or under one PCIe switch (the three example boards)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpupool.contract import dra
from gpupool.nodeagent.dra.slices import SlicePublisher, topology_groups
from gpupool.nodeagent.fakegpus import FakeGpuBackend

BOARDS = Path(__file__).resolve().parents[3] / "examples" / "boards"


def groups(board: str, attribute: str) -> list[str | None]:
    gpus = FakeGpuBackend(BOARDS / board).discover()
    found = topology_groups(gpus)
    return [found[g.uuid].get(attribute) for g in gpus]


@pytest.mark.parametrize(("board", "attribute", "expected"), [
    ("nvswitch-8x-h100.yaml", "nvlinkClique", ["clique-0"] * 8),
    ("mixed-dgx1-v100.yaml", "nvlinkClique", ["clique-0"] * 4 + ["clique-4"] * 4),
    ("pcie-4-4-l40s.yaml", "nvlinkClique", [None] * 8),
    ("pcie-4-4-l40s.yaml", "pcieSwitch",
     ["switch-0", "switch-0", "switch-2", "switch-2", "switch-4", "switch-4", "switch-6",
      "switch-6"]),
], ids=["NVSwitch: one clique", "hybrid cube-mesh: the two fully joined quads",
        "PCIe: no NVLink, no clique", "PCIe: GPUs paired by their switch"])
def test_topology_groups_of_the_example_boards(board: str, attribute: str,
                                               expected: list[str | None]) -> None:
    assert groups(board, attribute) == expected


def test_the_groups_are_driver_attributes_of_the_published_devices() -> None:
    gpus = FakeGpuBackend(BOARDS / "mixed-dgx1-v100.yaml").discover()
    devices = SlicePublisher("n", api=None).devices(  # type: ignore[arg-type]
        gpus, lambda g: {}, {}, datetime(2026, 1, 1, tzinfo=UTC))
    values = [d["attributes"]["nvlinkClique"] for d in devices]
    assert values == [{"string": "clique-0"}] * 4 + [{"string": "clique-4"}] * 4
    assert all(len(d["attributes"]) + len(d["capacity"]) <= dra.MAX_ATTRIBUTES
               for d in devices)


def test_a_node_whose_links_are_unknown_publishes_no_groups() -> None:
    from gpupool.nodeagent.gpu import GpuInfo
    assert topology_groups([GpuInfo("GPU-a", 0, "T4", 15360), GpuInfo("GPU-b", 1, "T4", 15360)]
                           ) == {"GPU-a": {}, "GPU-b": {}}
