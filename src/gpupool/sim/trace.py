"""Reader for the Alibaba GPU trace CSVs (cluster-trace-gpu-v2023, "openb").

Rows become core values here, and only here:

* node list (``sn,cpu_milli,memory_mib,gpu,model``) -> ``Node`` with ``gpu``
  identical GPUs of ``model``; GPU memory per model comes from
  ``GPU_MEMORY_MIB`` (trace pods ask no GPU memory, so it does not change any
  result; it only has to be a valid capacity);
* pod list (``name,cpu_milli,memory_mib,num_gpu,gpu_milli`` plus, when present,
  ``gpu_spec``, ``creation_time``, ``deletion_time``) -> ``TracePod``:

  ========================  ===================================================
  ``num_gpu`` = 0           no GPU (``gpu_milli`` must be 0)
  ``gpu_milli`` = 1000      ``GpuDemand(num_gpu, mode=EXCLUSIVE)``: whole GPUs
  ``gpu_milli`` in 1..999   ``GpuDemand(1, memory_mib=0, core_pct=⌈gpu_milli/10⌉,
                            mode=SHARED)`` (``num_gpu`` must be 1)
  ``gpu_spec`` ``A|B``      ``models=frozenset({"A", "B"})``; empty: any model
  ========================  ===================================================

The trace's fraction covers both GPU memory and GPU time; gpupool accounts it
on the compute axis only (1 % units; every trace value is a multiple of 10).
A malformed row raises ``InvalidInput`` naming the file and line. A file may start
with a UTF-8 byte order mark (as spreadsheets write them).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator, Mapping
from pathlib import Path

from gpupool.core.errors import GpupoolError, InvalidInput
from gpupool.core.model import Node, uniform_node
from gpupool.core.request import MAX_GPUS_PER_POD, GpuDemand, Mode, PodRequest
from gpupool.sim.scenario import TracePod

GIB = 1024

GPU_MEMORY_MIB: Mapping[str, int] = {
    "T4": 16 * GIB,
    "P100": 16 * GIB,
    "V100M16": 16 * GIB,
    "V100M32": 32 * GIB,
    "A10": 24 * GIB,
    "G2": 32 * GIB,  # undisclosed model; placeholder (trace pods ask no GPU memory)
    "G3": 80 * GIB,  # undisclosed model; placeholder (trace pods ask no GPU memory)
}
"""GPU memory per trace model. G1/G2/G3 are Alibaba's undisclosed codes."""

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
WHOLE_GPU_MILLI = 1000


class _Rows:
    """A CSV file as (line number, row dict) with errors that name file and line."""

    def __init__(self, path: Path, required: tuple[str, ...]):
        self.path = path
        self.required = required
        self.line = 0

    def error(self, message: str) -> InvalidInput:
        return InvalidInput(f"{self.path}:{self.line}: {message}")

    def __iter__(self) -> Iterator[dict[str, str]]:
        try:
            with self.path.open(newline="", encoding="utf-8-sig") as handle:
                yield from self._read(handle)
        except OSError as exc:
            raise InvalidInput(f"cannot read {self.path}: {exc.strerror or exc}") from None
        except (csv.Error, UnicodeDecodeError) as exc:
            raise self.error(f"not a readable CSV file ({exc})") from None

    def _read(self, handle: object) -> Iterator[dict[str, str]]:
        reader = csv.reader(handle)  # type: ignore[arg-type]
        header = next(reader, None)
        self.line = 1
        if header is None:
            raise self.error("empty file, expected a header line")
        header = [h.strip() for h in header]
        missing = [c for c in self.required if c not in header]
        if missing:
            raise self.error(f"missing column(s) {', '.join(missing)} in header {header}")
        for row in reader:
            self.line = reader.line_num
            if not row or all(not cell.strip() for cell in row):
                continue
            if len(row) != len(header):
                raise self.error(f"expected {len(header)} fields, got {len(row)}")
            yield {h: cell.strip() for h, cell in zip(header, row, strict=True)}

    def integer(self, row: Mapping[str, str], column: str) -> int:
        text = row[column]
        try:
            value = int(text)
        except ValueError:
            raise self.error(f"{column} must be a whole number, got {text!r}") from None
        if value < 0:
            raise self.error(f"{column} must be >= 0, got {value}")
        return value

    def seconds(self, row: Mapping[str, str], column: str) -> float | None:
        text = row.get(column, "")
        if not text:
            return None
        try:
            value = float(text)
        except ValueError:
            raise self.error(f"{column} must be a number of seconds, got {text!r}") from None
        if not math.isfinite(value):
            raise self.error(f"{column} must be finite, got {text!r}")
        return value


def read_nodes(path: Path, gpu_memory_mib: Mapping[str, int] = GPU_MEMORY_MIB) -> list[Node]:
    """Nodes of an ``openb_node_list_*.csv`` file."""
    rows = _Rows(Path(path), NODE_COLUMNS)
    nodes: list[Node] = []
    seen: set[str] = set()
    for row in rows:
        name, model = row["sn"], row["model"]
        count = rows.integer(row, "gpu")
        if not name:
            raise rows.error("empty node name (sn)")
        if name in seen:
            raise rows.error(f"node {name} appears twice")
        if count and model not in gpu_memory_mib:
            known = ", ".join(sorted(gpu_memory_mib))
            raise rows.error(f"unknown GPU model {model!r} (known: {known})")
        seen.add(name)
        nodes.append(uniform_node(name, rows.integer(row, "cpu_milli"),
                                  rows.integer(row, "memory_mib"), count,
                                  model if count else "", gpu_memory_mib.get(model, 1)))
    if not nodes:
        raise InvalidInput(f"{path}: no nodes")
    return nodes


def read_pods(path: Path) -> list[TracePod]:
    """Pods of an ``openb_pod_list_*.csv`` file (5 columns or the full 11)."""
    rows = _Rows(Path(path), POD_COLUMNS)
    pods: list[TracePod] = []
    seen: set[str] = set()
    for row in rows:
        name = row["name"]
        if not name:
            raise rows.error("empty pod name")
        if name in seen:
            raise rows.error(f"pod {name} appears twice")
        seen.add(name)
        cpu, memory = rows.integer(row, "cpu_milli"), rows.integer(row, "memory_mib")
        demand = _gpu_demand(rows, row)
        try:
            request = PodRequest(name, cpu, memory, demand, _models(row.get("gpu_spec", "")))
        except GpupoolError as exc:
            raise rows.error(str(exc)) from None
        created = rows.seconds(row, "creation_time")
        deleted = rows.seconds(row, "deletion_time")
        if created is not None and deleted is not None and deleted < created:
            raise rows.error(f"deletion_time {deleted} is before creation_time {created}")
        pods.append(TracePod(request, created, deleted))
    if not pods:
        raise InvalidInput(f"{path}: no pods")
    return pods


def _gpu_demand(rows: _Rows, row: Mapping[str, str]) -> tuple[GpuDemand, ...]:
    count, milli = rows.integer(row, "num_gpu"), rows.integer(row, "gpu_milli")
    if count > MAX_GPUS_PER_POD:
        raise rows.error(f"num_gpu must be 0..{MAX_GPUS_PER_POD}, got {count}")
    if count == 0:
        if milli:
            raise rows.error(f"gpu_milli is {milli} but num_gpu is 0")
        return ()
    if milli == WHOLE_GPU_MILLI:
        return (GpuDemand(count, mode=Mode.EXCLUSIVE),)
    if not 0 < milli < WHOLE_GPU_MILLI:
        raise rows.error(f"gpu_milli must be 1..1000 when num_gpu > 0, got {milli}")
    if count != 1:
        raise rows.error(f"a GPU fraction (gpu_milli {milli}) needs num_gpu 1, got {count}")
    return (GpuDemand(1, memory_mib=0, core_pct=math.ceil(milli / 10), mode=Mode.SHARED),)


def _models(spec: str) -> frozenset[str] | None:
    models = frozenset(m.strip() for m in spec.split("|") if m.strip())
    return models or None
