"""Simulator benchmark on the Alibaba GPU trace (not a test: it prints figures).

Default: one 130 %-inflated protocol run of the default trace (1,213 nodes) per
policy, seed 42, in this process; prints wall time, median and p99 decision
time, pods per second, the simulator's own cost per pod (wall minus time in
``Placer.decide``), and the ratio of FGD to best-fit measured in the same run.
It then times a small campaign with one worker and with two, to show whether
the process pool pays.

``--acceptance``: the full table — seeds 42-51 on the default, gpushare20 and
multigpu20 traces — printing mean ± std unallocated GPU % per policy.

    .venv/bin/python bench/bench_simulator.py [--trace-dir DIR] [--acceptance]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gpupool.sim.campaign import Campaign, aggregate, run_campaign
from gpupool.sim.protocol import ProtocolRun, run_protocol
from gpupool.sim.scenario import Scenario
from gpupool.sim.sources import scenario_from_files

REPO = Path(__file__).resolve().parents[1]
TRACE_DIR = REPO.parent / "shared" / "traces" / "alibaba-gpu-2023"
NODES = "openb_node_list_gpu_node.csv"
TRACES = ("default", "gpushare20", "multigpu20")
SPEED_POLICIES = ("fgd", "fgd-balance", "best-fit")
ACCEPTANCE_POLICIES = ("fgd", "fgd-balance", "best-fit", "random")
PUBLISHED = {("default", "fgd"): 4.77, ("default", "best-fit"): 7.14,
             ("default", "random"): 13.70, ("multigpu20", "fgd"): 4.5}


def load(trace_dir: Path, name: str) -> Scenario:
    return scenario_from_files(trace_dir / NODES, trace_dir / f"openb_pod_list_{name}.csv")


def speed(scenario: Scenario, policies: tuple[str, ...]) -> None:
    config = Campaign(scenario, policies, (42,)).config()
    print(f"one run per policy: {scenario.name}, {len(scenario.nodes)} nodes, "
          f"{scenario.gpu_capacity_milli // 1000} GPUs, inflate 1.3, seed 42")
    print(f"{'policy':<12} {'wall s':>7} {'median ms':>10} {'p99 ms':>8} {'pods/s':>8} "
          f"{'sim µs/pod':>10} {'unalloc %':>9}")
    runs: dict[str, ProtocolRun] = {}
    for policy in policies:
        run = runs[policy] = run_protocol(scenario, policy, 42, 1.3, config)
        own_us = (run.wall_s - run.decision_total_s) / run.pods * 1e6
        print(f"{policy:<12} {run.wall_s:>7.2f} {run.decision_median_ms:>10.3f} "
              f"{run.decision_p99_ms:>8.3f} {run.pods / run.wall_s:>8.0f} {own_us:>10.1f} "
              f"{run.unallocated_gpu_pct:>9.2f}")
    if "fgd" in runs and "best-fit" in runs:
        fgd, bf = runs["fgd"], runs["best-fit"]
        print(f"FGD / best-fit: wall {fgd.wall_s / bf.wall_s:.2f}x, "
              f"median decision {fgd.decision_median_ms / bf.decision_median_ms:.2f}x")


def pool(scenario: Scenario) -> None:
    campaign = Campaign(scenario, ("fgd", "best-fit"), (42, 43))
    for workers in (1, 2):
        started = time.perf_counter()
        run_campaign(campaign, workers)
        print(f"campaign fgd+best-fit × 2 seeds, {workers} worker(s): "
              f"{time.perf_counter() - started:.1f} s")


def acceptance(trace_dir: Path, policies: tuple[str, ...], workers: int) -> None:
    seeds = tuple(range(42, 52))
    for name in TRACES:
        scenario = load(trace_dir, name)
        started = time.perf_counter()
        stats = aggregate(run_campaign(Campaign(scenario, policies, seeds), workers))
        print(f"\n{name}: seeds 42-51, inflate 1.3 ({time.perf_counter() - started:.0f} s)")
        for s in stats:
            ref = PUBLISHED.get((name, s.policy))
            paper = f"  (published {ref:.2f})" if ref is not None else ""
            print(f"  {s.policy:<12} {s.mean_unallocated_gpu_pct:6.2f} ± "
                  f"{s.std_unallocated_gpu_pct:.2f} % unallocated, "
                  f"{s.mean_failed_pods:7.1f} failed pods{paper}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace-dir", type=Path, default=TRACE_DIR)
    parser.add_argument("--acceptance", action="store_true",
                        help="seeds 42-51 on default, gpushare20 and multigpu20")
    parser.add_argument("--policy", action="append", help="policies (repeatable)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    if not (args.trace_dir / NODES).is_file():
        print(f"trace not found in {args.trace_dir} (see docs/simulator.md)", file=sys.stderr)
        return 2
    if args.acceptance:
        acceptance(args.trace_dir, tuple(args.policy or ACCEPTANCE_POLICIES), args.workers)
        return 0
    scenario = load(args.trace_dir, "default")
    speed(scenario, tuple(args.policy or SPEED_POLICIES))
    pool(scenario)
    return 0


if __name__ == "__main__":
    sys.exit(main())
