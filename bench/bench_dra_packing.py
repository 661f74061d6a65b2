"""How much packing DRA's own allocation loses against gpupool's choice (prints figures).

The FGD protocol (``gpupool.sim.protocol``: 130 % inflation, shuffled arrivals, seeded node
order) on the Alibaba default trace (1,213 nodes), each seed run five ways
(``gpupool.sim.dra``, whose docstring defines the variants): kube-scheduler's DRA
allocation alone, kube-scheduler with gpupool's ``prioritize-claims`` (weight 5, weight
100, and only the policy's choice at 10), gpupool's device-plugin path, the policy's exact
choice, and the simulator's own protocol run. Prints, per variant, the unallocated GPU
share when the arrived demand reaches the capacity (mean ± std over seeds), the free share
stranded on partly used GPUs, the pods refused before that point, and the ratio against
``device-plugin`` measured in the same run, as Markdown rows for docs/benchmarks.md.

    .venv/bin/python bench/bench_dra_packing.py [--seeds 42-51] [--workers 2]
        [--trace-dir DIR] [--policy fgd-balance] [--variant NAME ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from gpupool.cli.simulate import seeds as parse_seeds
from gpupool.core.policies import DEFAULT_POLICY
from gpupool.sim.dra import VARIANTS, DraRun, run_variant
from gpupool.sim.scenario import Scenario
from gpupool.sim.sources import scenario_from_files

REPO = Path(__file__).resolve().parents[1]
TRACE_DIR = REPO.parent / "shared" / "traces" / "alibaba-gpu-2023"
NODES, PODS = "openb_node_list_gpu_node.csv", "openb_pod_list_default.csv"
REFERENCE = "device-plugin"

_SCENARIO: Scenario | None = None


def _adopt(trace_dir: Path) -> None:
    global _SCENARIO  # one read of the trace per worker process
    _SCENARIO = scenario_from_files(trace_dir / NODES, trace_dir / PODS)


def _run(job: tuple[str, int, str]) -> DraRun:
    variant, seed, policy = job
    assert _SCENARIO is not None
    return run_variant(_SCENARIO, variant, seed, policy=policy)


def mean_std(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=parse_seeds, default=parse_seeds("42-51"))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--trace-dir", type=Path, default=TRACE_DIR)
    p.add_argument("--policy", default=DEFAULT_POLICY)
    p.add_argument("--variant", action="append", choices=list(VARIANTS))
    args = p.parse_args()
    if not (args.trace_dir / PODS).is_file():
        print(f"skipped: the Alibaba trace is not in {args.trace_dir} ({PODS} absent)")
        return 0
    variants = args.variant or list(VARIANTS)
    jobs = [(v, s, args.policy) for s in args.seeds for v in variants]
    started = time.perf_counter()
    with ProcessPoolExecutor(args.workers, initializer=_adopt,
                             initargs=(args.trace_dir,)) as pool:
        runs = list(pool.map(_run, jobs))
    wall = time.perf_counter() - started
    report(runs, variants, args, wall)
    return 0


def report(runs: list[DraRun], variants: list[str], args: argparse.Namespace,
           wall: float) -> None:
    by = {v: [r for r in runs if r.variant == v] for v in variants}
    seeds = sorted({r.seed for r in runs})
    print(f"Alibaba default trace, policy {args.policy}, seeds {seeds[0]}-{seeds[-1]} "
          f"({len(seeds)}), {len(runs)} runs in {wall:.0f} s with {args.workers} workers")
    ref = by.get(REFERENCE)
    header = "| variant | unallocated GPU % | stranded on partly used GPUs % | refused " \
             "before full | unallocated vs device-plugin (same seed, mean) | s/run |"
    print(header)
    print("|---|---|---|---|---|---|")
    for v in variants:
        rs = by[v]
        ratio = "–"
        if ref and v != REFERENCE:
            pairs = {r.seed: r.unallocated_gpu_pct for r in ref}
            ratio = f"{statistics.mean(r.unallocated_gpu_pct / pairs[r.seed] for r in rs):.2f}×"
        print(f"| {v} | {mean_std([r.unallocated_gpu_pct for r in rs])} | "
              f"{mean_std([r.stranded_gpu_pct for r in rs])} | "
              f"{statistics.mean(r.failed_before_full for r in rs):.0f} | {ratio} | "
              f"{statistics.mean(r.wall_s for r in rs):.1f} |")
    if "dra-first-fit" in by and "gpupool-prioritize" in by:
        lost = [a.unallocated_gpu_pct - b.unallocated_gpu_pct
                for a, b in zip(by["dra-first-fit"], by["gpupool-prioritize"], strict=True)]
        print(f"gpupool's prioritize recovers {mean_std(lost)} points of GPU share that "
              "DRA's own allocation leaves unallocated")


if __name__ == "__main__":
    sys.exit(main())
