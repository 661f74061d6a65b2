"""Where a scenario comes from: trace CSVs or native YAML, chosen by file extension."""

from __future__ import annotations

from pathlib import Path

from gpupool.core.classes import ResourceClass
from gpupool.core.errors import InvalidInput
from gpupool.core.model import Node
from gpupool.sim import native, trace
from gpupool.sim.scenario import Scenario, TracePod

CSV = (".csv",)
YAML = (".yaml", ".yml")


def _kind(path: Path) -> str:
    if path.is_dir():
        raise InvalidInput(f"{path}: is a folder; expected a .csv or .yaml file")
    if not path.is_file():
        raise InvalidInput(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix in CSV:
        return "csv"
    if suffix in YAML:
        return "yaml"
    raise InvalidInput(f"{path}: unknown format (expected .csv for the Alibaba trace, "
                       ".yaml or .yml for gpupool's own format)")


def read_cluster(path: Path) -> tuple[list[Node], list[ResourceClass]]:
    if _kind(path) == "csv":
        return trace.read_nodes(path), []
    return native.read_cluster(path)


def read_pods(path: Path) -> list[TracePod]:
    if _kind(path) == "csv":
        return trace.read_pods(path)
    return native.read_workload(path)


def scenario_from_files(nodes: Path, pods: Path) -> Scenario:
    """The cluster of ``nodes`` and the workload of ``pods`` (may be the same YAML file)."""
    cluster, classes = read_cluster(Path(nodes))
    workload = read_pods(Path(pods))
    return Scenario(Path(pods).stem, tuple(cluster), tuple(workload), tuple(classes))
