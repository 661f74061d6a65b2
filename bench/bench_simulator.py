"""Simulator benchmark on the Alibaba GPU trace and the generated mixes (prints figures).

Default: one 130 %-inflated protocol run of the default trace (1,213 nodes) per
policy, seed 42, in this process; prints wall time, median and p99 decision
time, pods per second, the simulator's own cost per pod (wall minus time in
``Placer.decide``), and the ratio of FGD to best-fit measured in the same run.
It then times the default policy against the simulator as it was before the
current default policy (``--baseline-rev``, checked out of git into a temporary
folder), alternating old and new runs in fresh processes, and prints the
ratio; and times a small campaign with one worker and with two.

``--acceptance``: the packing table — every trace in the trace folder and every
generated mix (``gpupool/sim/mixes.yaml``) × random, best-fit, FGD, the
default policy, and the default policy learning its workload online as the
extender does (``--learn``), seeds 42-51, mean ± std unallocated GPU %, as
Markdown rows; then the checks: the default ≤ FGD on every row, FGD on
gpuspec20 against the published 5.34 %, the default on the default trace ≤ 3.8 %.

    .venv/bin/python bench/bench_simulator.py [--trace-dir DIR] [--acceptance]
        [--only NAME ...] [--seeds 42-51] [--workers 2]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from gpupool.cli.simulate import seeds as parse_seeds
from gpupool.core.policies import DEFAULT_POLICY
from gpupool.sim.campaign import Campaign, PolicyStats, aggregate, run_campaign
from gpupool.sim.generate import read_mixes
from gpupool.sim.generate import scenario as mix_scenario
from gpupool.sim.learning import LEARN_EVERY
from gpupool.sim.protocol import ProtocolRun, run_protocol
from gpupool.sim.scenario import Scenario
from gpupool.sim.sources import scenario_from_files

REPO = Path(__file__).resolve().parents[1]
TRACE_DIR = REPO.parent / "shared" / "traces" / "alibaba-gpu-2023"
NODES = "openb_node_list_gpu_node.csv"
TRACES = ("default", "gpushare20", "multigpu20", "gpuspec20")
SPEED_POLICIES = ("fgd", DEFAULT_POLICY, "best-fit")
COLUMNS = ("random", "best-fit", "fgd", DEFAULT_POLICY)
LEARNED = f"{DEFAULT_POLICY} (learned)"
BASELINE_REV = "8fa95e3"
"""The simulator before the current default policy (model-aware FGD, dead share, memory,
scarcity): the baseline of the speed ratio."""
PUBLISHED = {("default", "fgd"): 4.77, ("default", "best-fit"): 7.14,
             ("default", "random"): 13.70, ("multigpu20", "fgd"): 4.5,
             ("gpuspec20", "fgd"): 5.34, ("gpuspec20", "best-fit"): 11.54}
TARGET_DEFAULT_PCT = 3.8


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


ONE_RUN = """
import json, sys, time
from pathlib import Path
from gpupool.sim.campaign import Campaign
from gpupool.sim.protocol import run_protocol
from gpupool.sim.sources import scenario_from_files
d = Path(sys.argv[1])
s = scenario_from_files(d / "openb_node_list_gpu_node.csv", d / "openb_pod_list_default.csv")
config = Campaign(s, (sys.argv[2],), (42,)).config()
cpu = time.process_time()
run = run_protocol(s, sys.argv[2], 42, 1.3, config)
print(json.dumps([run.wall_s, time.process_time() - cpu, run.unallocated_gpu_pct]))
"""


def one_run(src: Path, trace_dir: Path, policy: str) -> tuple[float, float, float]:
    """(wall s, CPU s, unallocated %) of one default-trace run of ``policy`` with the code
    in ``src``, in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-c", ONE_RUN, str(trace_dir), policy], env=env,
                         check=True, capture_output=True, text=True).stdout
    wall, cpu, unallocated = json.loads(out.splitlines()[-1])
    return float(wall), float(cpu), float(unallocated)


def against_baseline(trace_dir: Path, rev: str, rounds: int = 3) -> None:
    """The default policy now and at ``rev``, alternating, in fresh processes; wall time
    and the process's CPU time (less sensitive to other jobs on a shared machine)."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", rev, "src"],
                                 check=True, capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        old: list[tuple[float, float, float]] = []
        new: list[tuple[float, float, float]] = []
        for _ in range(rounds):
            old.append(one_run(Path(tmp) / "src", trace_dir, DEFAULT_POLICY))
            new.append(one_run(REPO / "src", trace_dir, DEFAULT_POLICY))
    print(f"{DEFAULT_POLICY}, default trace, seed 42, {rounds} alternating rounds, at {rev} "
          f"({old[0][2]:.2f} % unallocated) and now ({new[0][2]:.2f} %); target <= 1.5x:")
    for k, what in ((0, "wall"), (1, "CPU")):
        before = statistics.median(r[k] for r in old)
        now = statistics.median(r[k] for r in new)
        print(f"  {what}: {before:.2f} s -> {now:.2f} s, {now / before:.2f}x (median); rounds "
              + ", ".join(f"{o[k]:.2f}/{n[k]:.2f}" for o, n in zip(old, new, strict=True)))


def pool(scenario: Scenario) -> None:
    campaign = Campaign(scenario, ("fgd", "best-fit"), (42, 43))
    for workers in (1, 2):
        started = time.perf_counter()
        run_campaign(campaign, workers)
        print(f"campaign fgd+best-fit × 2 seeds, {workers} worker(s): "
              f"{time.perf_counter() - started:.1f} s")


# -- acceptance -----------------------------------------------------------------------------
def workloads(trace_dir: Path, only: set[str] | None) -> list[tuple[str, Scenario]]:
    """Every trace found and every generated mix, by row name."""
    out: list[tuple[str, Scenario]] = []
    for name in TRACES:
        if (trace_dir / f"openb_pod_list_{name}.csv").is_file() and (not only or name in only):
            out.append((name, load(trace_dir, name)))
    for name, mix in read_mixes().items():
        if not only or name in only:
            out.append((f"mix {name}", mix_scenario(mix)))
    return out


def row_stats(scenario: Scenario, seeds: tuple[int, ...], workers: int
              ) -> dict[str, PolicyStats]:
    stats = {s.policy: s for s in aggregate(run_campaign(Campaign(scenario, COLUMNS, seeds),
                                                         workers))}
    learned = aggregate(run_campaign(Campaign(scenario, (DEFAULT_POLICY,), seeds,
                                              learn_every=LEARN_EVERY), workers))
    stats[LEARNED] = learned[0]
    return stats


def cell(s: PolicyStats, bold: bool = False) -> str:
    text = f"{s.mean_unallocated_gpu_pct:.2f} ± {s.std_unallocated_gpu_pct:.2f}"
    return f"**{text}**" if bold else text


def acceptance(trace_dir: Path, seeds: tuple[int, ...], workers: int,
               only: set[str] | None) -> int:
    print(f"seeds {seeds[0]}-{seeds[-1]} ({len(seeds)}), inflate 1.3, unallocated GPU % "
          "(mean ± std); learned: the workload re-derived every "
          f"{LEARN_EVERY:.0f} arrivals from what was seen, as the extender does")
    print("| workload | " + " | ".join((*COLUMNS, LEARNED)) + " | default − FGD |")
    print("|---" * (len(COLUMNS) + 3) + "|")
    results: dict[str, dict[str, PolicyStats]] = {}
    for name, scenario in workloads(trace_dir, only):
        started = time.perf_counter()
        stats = results[name] = row_stats(scenario, seeds, workers)
        gap = (stats[DEFAULT_POLICY].mean_unallocated_gpu_pct or 0.0) - (
            stats["fgd"].mean_unallocated_gpu_pct or 0.0)
        cells = [cell(stats[p], p == DEFAULT_POLICY) for p in (*COLUMNS, LEARNED)]
        print(f"| {name} | " + " | ".join(cells) + f" | {gap:+.2f} |  "
              f"<!-- {time.perf_counter() - started:.0f} s -->", flush=True)
    return checks(results)


def checks(results: dict[str, dict[str, PolicyStats]]) -> int:
    worse = [n for n, s in results.items() if (s[DEFAULT_POLICY].mean_unallocated_gpu_pct or 0)
             > (s["fgd"].mean_unallocated_gpu_pct or 0)]
    print(f"\ndefault <= FGD on every row: {'yes' if not worse else 'NO: ' + ', '.join(worse)}")
    for (trace, policy), published in PUBLISHED.items():
        if trace in results:
            got = results[trace][policy].mean_unallocated_gpu_pct or 0.0
            print(f"{trace} {policy}: {got:.2f} % (published {published:.2f}, "
                  f"{got - published:+.2f})")
    if "default" in results:
        got = results["default"][DEFAULT_POLICY].mean_unallocated_gpu_pct or 0.0
        print(f"default trace, {DEFAULT_POLICY}: {got:.2f} % (target <= {TARGET_DEFAULT_PCT})")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trace-dir", type=Path, default=TRACE_DIR)
    parser.add_argument("--acceptance", action="store_true",
                        help="the packing table: traces and mixes × policies, seeds 42-51")
    parser.add_argument("--only", action="append", metavar="NAME",
                        help="acceptance rows to run (a trace or a mix name; repeatable)")
    parser.add_argument("--seeds", type=parse_seeds, default=tuple(range(42, 52)))
    parser.add_argument("--policy", action="append", help="speed: policies (repeatable)")
    parser.add_argument("--baseline-rev", default=BASELINE_REV,
                        help=f"speed: the git revision to compare with (default {BASELINE_REV})")
    parser.add_argument("--rounds", type=int, default=3,
                        help="speed: alternating rounds against the baseline (default 3)")
    parser.add_argument("--baseline-only", action="store_true",
                        help="speed: only the comparison with the baseline revision")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    if args.acceptance:
        return acceptance(args.trace_dir, args.seeds, args.workers,
                          set(args.only) if args.only else None)
    if not (args.trace_dir / NODES).is_file():
        print(f"trace not found in {args.trace_dir} (see docs/simulator.md)", file=sys.stderr)
        return 2
    if args.baseline_only:
        against_baseline(args.trace_dir, args.baseline_rev, args.rounds)
        return 0
    scenario = load(args.trace_dir, "default")
    speed(scenario, tuple(args.policy or SPEED_POLICIES))
    against_baseline(args.trace_dir, args.baseline_rev, args.rounds)
    pool(scenario)
    return 0


if __name__ == "__main__":
    sys.exit(main())
