"""Link quality of multi-GPU placements: the core with boards vs today's (NUMA, then packing).

For each trace and seed, two runs of the FGD protocol (``gpupool.sim.topology.link_run``)
with the default policy: the nodes as today's core sees them (no links) and with the
boards ``gpupool.sim.topology.board`` gives them by GPU model; every multi-GPU placement
is graded by its weakest link on the board in both. Prints, per trace and mode, the
mean over seeds of: unallocated GPU % at full demand (packing), failed pods, multi-GPU
pods placed, the share whose weakest link is NVLink / one PCIe switch / several switches /
across sockets, the mean NVLink GB/s of the weakest pair, placements spanning two NUMA
nodes; then the differences (with boards minus without) as a Markdown table.

    .venv/bin/python bench/bench_topology.py [--trace-dir DIR] [--traces default multigpu20]
        [--seeds 42-51] [--inflate 1.3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from gpupool.cli.simulate import seeds as parse_seeds
from gpupool.core.policies import DEFAULT_POLICY
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.workload import TargetWorkload
from gpupool.sim.sources import scenario_from_files
from gpupool.sim.topology import LinkRun, link_run

REPO = Path(__file__).resolve().parents[1]
TRACE_DIR = REPO.parent / "shared" / "traces" / "alibaba-gpu-2023"
COLUMNS = ("NVLink", "PCIe switch", "PCIe switches", "across sockets")
SIZES = (2, 4)


def row(name: str, runs: list[LinkRun]) -> str:
    mean = statistics.mean
    cells = [f"{mean(r.unallocated_gpu_pct for r in runs):.2f}",
             f"{mean(r.failed_pods for r in runs):.0f}"]
    for size in SIZES:
        cells += [f"{mean(len(r.of_size(size)) for r in runs):.0f}",
                  *(f"{mean(r.share(size, c) for r in runs):.1f}" for c in COLUMNS),
                  f"{mean(r.mean_gbps(size) for r in runs):.1f}"]
    spans = [sum(g.numa_nodes > 1 for g in r.placements if g.gpus in SIZES) for r in runs]
    cells.append(f"{mean(spans):.1f}")
    return f"| {name} | " + " | ".join(cells) + " |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace-dir", type=Path, default=TRACE_DIR)
    ap.add_argument("--traces", nargs="+", default=["default", "multigpu20"])
    ap.add_argument("--seeds", type=parse_seeds, default=parse_seeds("42-51"))
    ap.add_argument("--inflate", type=float, default=1.3)
    args = ap.parse_args()
    head = ["trace, core", "unallocated GPU %", "failed pods"]
    for size in SIZES:
        head += [f"{size}-GPU pods", *(f"{size}: {c} %" for c in COLUMNS),
                 f"{size}: NVLink GB/s"]
    head.append("2-4 GPU pods spanning NUMA")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for trace in args.traces:
        scenario = scenario_from_files(args.trace_dir / "openb_node_list_gpu_node.csv",
                                       args.trace_dir / f"openb_pod_list_{trace}.csv")
        config = PolicyConfig(workload=TargetWorkload.from_requests(scenario.requests))
        for aware, label in ((False, "today (NUMA, packing)"), (True, "links first")):
            started = time.perf_counter()
            runs = [link_run(scenario, DEFAULT_POLICY, s, args.inflate, config, aware)
                    for s in args.seeds]
            print(row(f"{trace}, {label}", runs) +
                  f" <!-- {time.perf_counter() - started:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
