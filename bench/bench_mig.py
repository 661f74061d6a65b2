"""MIG in the simulator: the Alibaba trace's GPU pods served by MIG devices — NVIDIA's
all-balanced static layout, static layouts fitted to the trace's mix, layouts made on
demand — against today's sharing, on the same nodes and arrivals (docs/benchmarks.md).

The cluster is the trace's G2 and G3 nodes (588 nodes, 4,704 GPUs), each GPU taken as an
A100-SXM4-80GB (the trace's other models have no MIG; G2 and G3 are undisclosed: see
``gpupool.sim.mig``); the workload is every pod of the trace file (CPU-only pods take CPU,
as in the FGD protocol). Each (trace, regime, seed) runs once with ``best-fit``, and
sharing also with gpupool's default policy. Printed as Markdown rows: GPU pods served,
demand served and unallocated GPU (% of capacity, at the pod where the arrived demand
reaches the capacity; mean ± std over seeds), GPU repartitions, and seconds per run.

    .venv/bin/python bench/bench_mig.py [--trace-dir DIR] [--seeds 42-46] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from bench_remote import mean_std  # bench/ is the script's own directory

from gpupool.cli.simulate import seeds as parse_seeds
from gpupool.core.policies import DEFAULT_POLICY
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.workload import TargetWorkload
from gpupool.sim.mig import MigRun, Regime, mig_nodes, run_regime
from gpupool.sim.trace import read_nodes, read_pods

REPO = Path(__file__).resolve().parents[1]
TRACE_DIR = REPO.parent / "shared" / "traces" / "alibaba-gpu-2023"
NODES = "openb_node_list_gpu_node.csv"
TRACES = ("default", "gpushare20")
MIG_MODELS = frozenset({"G2", "G3"})


def row(trace: str, runs: list[MigRun]) -> str:
    first = runs[0]
    return (f"| {trace} | {first.regime} | {first.policy} | "
            f"{mean_std([r.served_pct for r in runs])} | "
            f"{mean_std([r.demand_served_pct for r in runs])} | "
            f"{mean_std([r.unallocated_pct for r in runs])} | "
            f"{statistics.fmean([r.repartitions for r in runs]):.0f} | "
            f"{statistics.fmean([r.wall_s for r in runs]):.1f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace-dir", type=Path, default=TRACE_DIR)
    p.add_argument("--seeds", type=parse_seeds, default=parse_seeds("42-46"))
    p.add_argument("--only", action="append", default=[], choices=TRACES)
    args = p.parse_args()
    nodes = mig_nodes(read_nodes(args.trace_dir / NODES), MIG_MODELS)
    print(f"{len(nodes)} nodes, {sum(len(n.gpus) for n in nodes)} GPUs; seeds "
          f"{args.seeds[0]}-{args.seeds[-1]}")
    print("| trace | regime | policy | GPU pods served % | demand served % | unallocated % "
          "| repartitions | s per run |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    started = time.perf_counter()
    for trace in args.only or TRACES:
        requests = [p.request for p in read_pods(args.trace_dir /
                                                 f"openb_pod_list_{trace}.csv")]
        config = PolicyConfig(workload=TargetWorkload.from_requests(requests))
        runs = [(Regime.SHARING, DEFAULT_POLICY), *((r, "best-fit") for r in Regime)]
        for regime, policy in runs:
            print(row(trace, [run_regime(regime, nodes, requests, s, policy=policy,
                                         config=config) for s in args.seeds]), flush=True)
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
