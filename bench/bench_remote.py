"""What remote GPU slices buy in the simulator (prints figures; docs/remote.md).

Every scenario runs twice per policy and seed, with ``--remote off`` and ``--remote on``
(the same seeds, so each "on" run has its "off" run as baseline): the four shared trace
variants on **all** 1,523 nodes of ``openb_node_list_all_node.csv`` (310 of them without
GPUs) and the generated mixes ``cpu-heavy-remote`` and ``cpu-heavy-remote-2x`` (published
cluster plus the 310 nodes without GPUs, 4 zones). Printed as Markdown rows: unallocated
GPU % off and on (mean ± std over seeds), the difference, GPU pods on nodes without GPUs,
slices served from another node, the share served by the pod's own node, slices served
within the pod's zone, all at the headline pod (arrived demand = 100 % of capacity), and
the median decision time off and on.

    .venv/bin/python bench/bench_remote.py [--trace-dir DIR] [--seeds 42-51]
        [--policy NAME ...] [--only NAME ...] [--workers 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from gpupool.cli.simulate import seeds as parse_seeds
from gpupool.core.policies import DEFAULT_POLICY
from gpupool.core.serving import ZONE_LABEL
from gpupool.sim.campaign import Campaign, run_campaign
from gpupool.sim.generate import find_mix
from gpupool.sim.generate import scenario as mix_scenario
from gpupool.sim.protocol import ProtocolRun
from gpupool.sim.remote import RemoteMode
from gpupool.sim.scenario import Scenario
from gpupool.sim.sources import scenario_from_files

REPO = Path(__file__).resolve().parents[1]
TRACE_DIR = REPO.parent / "shared" / "traces" / "alibaba-gpu-2023"
NODES = "openb_node_list_all_node.csv"
TRACES = ("default", "gpushare20", "multigpu20", "gpuspec20")
MIXES = ("cpu-heavy-remote", "cpu-heavy-remote-2x")
POLICIES = (DEFAULT_POLICY, "fgd", "best-fit")


def scenarios(trace_dir: Path, only: set[str]) -> list[tuple[str, Scenario]]:
    out = []
    for name in TRACES:
        if (not only or name in only) and (trace_dir / f"openb_pod_list_{name}.csv").is_file():
            out.append((name, scenario_from_files(trace_dir / NODES,
                                                  trace_dir / f"openb_pod_list_{name}.csv")))
    out += [(m, mix_scenario(find_mix(m))) for m in MIXES if not only or m in only]
    return out


def mean_std(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.2f} ± {std:.2f}"


def mean(values: list[float]) -> float:
    return statistics.fmean(values)


def row(name: str, policy: str, off: list[ProtocolRun], on: list[ProtocolRun]) -> str:
    gain = mean([a.unallocated_gpu_pct - b.unallocated_gpu_pct
                 for a, b in zip(off, on, strict=True)])
    zone = mean([float(r.slices.by_tier.get(ZONE_LABEL, 0)) for r in on])
    return (f"| {name} | {policy} | {mean_std([r.unallocated_gpu_pct for r in off])} | "
            f"{mean_std([r.unallocated_gpu_pct for r in on])} | {gain:.2f} | "
            f"{mean([float(r.slices.gpu_pods_on_gpuless_nodes) for r in on]):.0f} | "
            f"{mean([float(r.slices.remote_slices) for r in on]):.0f} | "
            f"{mean([float(r.slices.gpu_pods_placed) for r in on]):.0f} | "
            f"{mean([r.slices.local_slices_pct for r in on]):.2f} | {zone:.0f} | "
            f"{statistics.median(r.decision_median_ms for r in off):.3f} / "
            f"{statistics.median(r.decision_median_ms for r in on):.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace-dir", type=Path, default=TRACE_DIR)
    parser.add_argument("--seeds", type=parse_seeds, default=parse_seeds("42-51"))
    parser.add_argument("--policy", action="append")
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    policies = tuple(args.policy or POLICIES)
    print(f"seeds {args.seeds[0]}-{args.seeds[-1]} ({len(args.seeds)}), inflate 1.3, "
          f"traces on {NODES}")
    print("| workload | policy | unallocated GPU % off | on | off − on | GPU pods on nodes "
          "without GPUs | slices from another node | GPU pods placed | % served by own node "
          "| slices within the zone | decision ms off / on |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    started = time.perf_counter()
    for name, scenario in scenarios(args.trace_dir, set(args.only)):
        runs = {mode: run_campaign(Campaign(scenario, policies, args.seeds, remote=mode),
                                   args.workers) for mode in (RemoteMode.OFF, RemoteMode.ON)}
        for policy in policies:
            off, on = ([r for r in runs[m] if r.policy == policy and isinstance(r, ProtocolRun)]
                       for m in (RemoteMode.OFF, RemoteMode.ON))
            print(row(name, policy, off, on), flush=True)
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
