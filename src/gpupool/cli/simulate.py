"""``gpupool simulate``: run placement policies over a trace and report how well they pack.

With no arguments it runs the built-in synthetic cluster and workload
(``gpupool.sim.synthetic``) with the default policies and seeds. The flags are
relied on by automation; see docs/simulator.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from rich.console import Console
from rich.table import Table

from gpupool.cli.args import bounded, check_policies, check_weights, weight
from gpupool.cli.tables import screen, show
from gpupool.core.errors import InvalidInput
from gpupool.core.policies import POLICIES
from gpupool.core.serving import ZONE_LABEL
from gpupool.sim.campaign import (
    Campaign,
    CampaignInterrupted,
    PolicyStats,
    Run,
    SimMode,
    aggregate,
    default_workers,
    run_campaign,
)
from gpupool.sim.generate import MIXES_FILE, find_mix
from gpupool.sim.generate import scenario as mix_scenario
from gpupool.sim.learning import LEARN_EVERY
from gpupool.sim.remote import RemoteMode
from gpupool.sim.scenario import Scenario
from gpupool.sim.sources import scenario_from_files
from gpupool.sim.synthetic import DEFAULT_NODES, TRACE_NODES, synthetic_scenario
from gpupool.sim.tenants import Tenancy, tenancy_for
from gpupool.sim.tenants_replay import GRACE_S, run_tenants
from gpupool.sim.window import ALL_NODES, nodes_to_find

DEFAULT_POLICIES = ("fgd", "fgd-balance", "best-fit", "random")
REMOTE_COLUMNS = ("local slices %", "remote slices", "on GPU-less nodes")
REMOTE_OPTIONAL = ("on GPU-less nodes", "remote slices")
"""With --remote: the columns left out first when the table does not fit."""
DEFAULT_SEEDS = "42-46"
MAX_SEEDS = 10_000
PROGRESS_MIN_PODS = 20_000
"""Below this many pods in all runs together the progress bar is not worth drawing."""


def seeds(spec: str) -> tuple[int, ...]:
    """``42-51``, ``1,2,5`` or a mix (``42-44,50``) -> the seeds, in order, without repeats."""
    out: dict[int, None] = {}
    for part in spec.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi if sep else lo)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"bad seed list {spec!r}: use a range like 42-51 or a list like 1,2,5") from None
        if first < 0 or last < first or last - first >= MAX_SEEDS:
            raise argparse.ArgumentTypeError(f"bad seed range {part.strip()!r}")
        out.update(dict.fromkeys(range(first, last + 1)))
    return tuple(out)


def seeds_text(chosen: Sequence[int]) -> str:
    """Seeds as ``seeds`` reads them, runs of consecutive seeds as ranges: ``42-46,50``."""
    parts: list[str] = []
    for seed in chosen:
        if parts and parts[-1].split("-")[-1] == str(seed - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{seed}"
        else:
            parts.append(str(seed))
    return ",".join(parts)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "simulate", help="replay a workload through the placement policies",
        description="Replay a cluster trace through gpupool's placement policies (the FGD "
                    "paper's protocol by default) and report the unallocated GPU share. "
                    "Without --nodes/--pods: a built-in synthetic cluster and workload.")
    p.add_argument("--nodes", type=Path, metavar="FILE",
                   help="cluster: Alibaba node-list CSV or gpupool YAML")
    p.add_argument("--pods", type=Path, metavar="FILE",
                   help="workload: Alibaba pod-list CSV or gpupool YAML")
    p.add_argument("--policy", action="append", metavar="NAME",
                   help=f"policy to run (repeatable; default: {', '.join(DEFAULT_POLICIES)}; "
                        f"known: {', '.join(sorted(POLICIES))})")
    p.add_argument("--seeds", type=seeds, default=seeds(DEFAULT_SEEDS), metavar="SEEDS",
                   help=f"seeds as a range or list, e.g. 42-51 or 1,2,5 (default {DEFAULT_SEEDS})")
    p.add_argument("--inflate", type=bounded(float, 1.0, 10.0), default=1.3, metavar="X",
                   help="protocol: resample the trace until its GPU demand reaches X times "
                        "the GPU capacity (default 1.3)")
    p.add_argument("--mode", choices=[m.value for m in SimMode], default="protocol",
                   help="protocol: the FGD paper's (shuffle, inflate, no departures; the "
                        "default); timed: honour creation and deletion times")
    p.add_argument("--out", type=Path, default=Path("sim-out"), metavar="DIR",
                   help="output folder for summary.json, curves.csv, allocation.png "
                        "(default sim-out)")
    p.add_argument("--workers", type=bounded(int, 1), metavar="N",
                   help="processes to run (policy, seed) pairs in (default: one per core)")
    p.add_argument("--synthetic-nodes", type=bounded(int, 1), metavar="N",
                   help=f"size of the built-in synthetic cluster (default {DEFAULT_NODES}) "
                        f"or of a --mix's (default {TRACE_NODES}, the published cluster)")
    p.add_argument("--nodes-to-score", type=bounded(int, 0, 100), default=100, metavar="PCT",
                   help="model kube-scheduler's percentageOfNodesToScore: each pod is decided "
                        "among the window of nodes kube-scheduler would send the extender "
                        "(0: kube-scheduler's adaptive default; default 100: every node)")
    p.add_argument("--weight", type=weight, action="append", default=[], metavar="NAME=X",
                   help="policy weight, e.g. fgd-balance.lambda=0.5 (repeatable; the names "
                        "each policy reads: docs/cli.md; an unknown name is an error)")
    p.add_argument("--mix", metavar="NAME",
                   help="a generated workload on the published 1,213-node cluster instead of "
                        "--nodes/--pods (names: the mix file's; see docs/simulator.md)")
    p.add_argument("--mixes", type=Path, default=MIXES_FILE, metavar="FILE",
                   help="the mix file --mix reads (default: the one gpupool ships)")
    p.add_argument("--learn", action="store_true",
                   help="policies learn the target workload from the arrivals, as the "
                        "extender does, instead of being handed the whole trace's")
    p.add_argument("--learn-every", type=bounded(float, 1.0), default=LEARN_EVERY, metavar="N",
                   help=f"with --learn: re-derive the workload every N arrivals (protocol "
                        f"mode) or seconds (timed mode); default {LEARN_EVERY:.0f}")
    p.add_argument("--tenancy", type=Path, metavar="FILE",
                   help="timed mode: quota groups and cohorts, tenant and class quotas and "
                        "GPU permissions (YAML, see docs/tenancy.md) to "
                        "replay the pods' tenants under; a YAML pods file may hold them itself")
    p.add_argument("--tenants", metavar="N|qos",
                   help="timed mode: give the trace's pods tenants: tenant-<k> by a stable hash "
                        "of the pod name into N tenants, or the trace's qos column")
    p.add_argument("--eviction-grace", type=bounded(float, 0.0), default=GRACE_S, metavar="SECONDS",
                   help=f"with tenants: seconds a reclaimed or preempted pod keeps its GPUs "
                        f"(default {GRACE_S:g}, Kubernetes' termination grace period)")
    p.add_argument("--remote", choices=[m.value for m in RemoteMode], default="off",
                   help="protocol mode: every GPU pod's gpupool.io/placement: off (local), on "
                        "(remote-allowed: a pod that fits nowhere whole runs on another node "
                        "and gets its slice served from a GPU node) or required "
                        "(remote-required); default off; see docs/remote.md")
    p.add_argument("--topology-label", action="append", metavar="LABEL",
                   help=f"with --remote: a node label whose value is a topology domain "
                        f"remote slices are served from first; repeatable, most specific "
                        f"first (default {ZONE_LABEL})")
    p.add_argument("--gangs", type=bounded(int, 1), metavar="JOBS",
                   help="replay JOBS generated jobs (gangs of 2-64 members, single pods, "
                        "some burstable) placed whole and placed pod by pod, on the cluster "
                        "of --nodes or the synthetic one (docs/gangs.md)")
    p.add_argument("--gang-load", type=bounded(float, 0.0, above=True), default=1.1,
                   metavar="X", help="with --gangs: the offered GPU demand over the arrivals, "
                                     "as a multiple of the cluster's GPUs (default 1.1)")
    p.add_argument("--wide", action="store_true",
                   help="print every column of the tables, however wide the screen (by "
                        "default a table wider than the screen, or than 80 columns in a "
                        "pipe, leaves out its least important columns and names them)")
    p.set_defaults(func=simulate)
    _one_line_errors(p)


def _one_line_errors(parser: argparse.ArgumentParser) -> None:
    """Bad flags print one line and exit 2 (argparse would print the usage too, and leave
    unknown flags to the top-level parser). The subparser's class is the top-level
    parser's choice, so the two methods are replaced on this instance."""
    def error(message: str) -> NoReturn:
        parser.exit(2, f"{parser.prog}: {message} (see --help)\n")

    known = parser.parse_known_args

    def strict(args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
               ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = known(args, namespace)
        if extras:
            error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras

    parser.error = error  # type: ignore[method-assign]
    parser.parse_known_args = strict  # type: ignore[method-assign,assignment]


def load(args: argparse.Namespace) -> Scenario:
    if args.mix is not None:
        if args.nodes is not None or args.pods is not None:
            raise InvalidInput("--mix generates its own cluster and workload; it does not go "
                               "with --nodes/--pods")
        return mix_scenario(find_mix(args.mix, args.mixes), args.synthetic_nodes or TRACE_NODES)
    if (args.nodes is None) != (args.pods is None):
        raise InvalidInput("--nodes and --pods go together (neither: the built-in synthetic "
                           "cluster and workload)")
    if args.nodes is None:
        return synthetic_scenario(args.synthetic_nodes or DEFAULT_NODES)
    return scenario_from_files(args.nodes, args.pods)


def simulate(args: argparse.Namespace) -> int:
    policies = check_policies(args.policy or DEFAULT_POLICIES)
    if args.gangs is not None:
        from gpupool.cli.simulate_gangs import simulate_gangs
        check_weights(args.weight, policies)
        return simulate_gangs(args, policies)
    if args.remote != RemoteMode.OFF.value and args.mode != SimMode.PROTOCOL.value:
        raise InvalidInput("remote slices are simulated in protocol mode only (--mode protocol)")
    tenanted = _tenanted(args)
    if tenanted is not None:
        return _simulate_tenants(args, policies, *tenanted)
    check_weights(args.weight, policies)
    started = time.perf_counter()
    campaign = Campaign(load(args), policies, args.seeds, SimMode(args.mode), args.inflate,
                        dict(args.weight), args.nodes_to_score,
                        args.learn_every if args.learn else None, RemoteMode(args.remote),
                        tuple(args.topology_label or (ZONE_LABEL,)))
    workers = args.workers or default_workers(len(campaign.jobs))
    try:
        runs = _with_progress(campaign, workers)
    except CampaignInterrupted as stop:
        return _interrupted(args, campaign, stop, time.perf_counter() - started)
    wall = time.perf_counter() - started
    _report(args, campaign, runs, wall)
    return 0


def _report(args: argparse.Namespace, campaign: Campaign, runs: list[Run], wall: float,
            interrupted: bool = False) -> None:
    """Write the outputs (each to a temporary file renamed into place) and print the table."""
    from gpupool.sim.report import write_all  # matplotlib: only once there is a plot to draw

    stats = aggregate(runs)
    try:
        written = write_all(args.out, campaign, runs, stats, wall, interrupted)
    except OSError as exc:
        raise InvalidInput(f"cannot write to {args.out}: {exc.strerror or exc}") from None
    console = screen()
    show(console, _table(campaign, runs, stats, wall), wide=args.wide,
         optional=("decision ms", "wall s", "bounced pods", *REMOTE_OPTIONAL),
         more="--wide shows them")
    console.print(wrote(written), soft_wrap=True)


def wrote(paths: Sequence[Path]) -> str:
    """``wrote a, b to DIR`` (one line, never broken inside a path)."""
    folders = {p.parent for p in paths}
    if len(folders) == 1:
        return f"wrote {', '.join(p.name for p in paths)} to {folders.pop()}"
    return f"wrote {', '.join(str(p) for p in paths)}"


def _interrupted(args: argparse.Namespace, campaign: Campaign, stop: CampaignInterrupted,
                 wall: float) -> int:
    """Ctrl-C: the queued runs were cancelled; what finished is reported and written."""
    out = args.out
    if stop.runs:
        _report(args, campaign, stop.runs, wall, interrupted=True)
        print(f"gpupool simulate: interrupted; {len(stop.runs)} of {stop.planned} runs "
              f"finished and were written to {out}; the others were cancelled", file=sys.stderr)
    else:
        print(f"gpupool simulate: interrupted before any run finished; nothing was written "
              f"to {out}", file=sys.stderr)
    return 130


def _with_progress(campaign: Campaign, workers: int) -> list[Run]:
    total = campaign.planned_pods()
    console = Console(stderr=True)
    if total < PROGRESS_MIN_PODS or not console.is_terminal:
        return run_campaign(campaign, workers)
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    columns = (TextColumn("simulating"), BarColumn(), MofNCompleteColumn(), TextColumn("pods"),
               TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("pods", total=total)
        return run_campaign(campaign, workers, lambda n: bar.advance(task, n))


def _table(campaign: Campaign, runs: Sequence[Run], stats: Sequence[PolicyStats],
           wall: float) -> Table:
    s = campaign.scenario
    ran = [seed for seed in campaign.seeds if any(r.seed == seed for r in runs)]
    partial = len(runs) < len(campaign.jobs)
    lines = [f"{s.name}: {len(s.nodes)} nodes, {s.gpu_capacity_milli // 1000} GPUs, "
             f"{len(s.pods)} pods",
             f"{campaign.mode.value} mode, " + (
                 f"PARTIAL (interrupted): {len(runs)} of {len(campaign.jobs)} runs, seeds "
                 f"{seeds_text(ran)} of {seeds_text(campaign.seeds)}" if partial else
                 f"{len(campaign.seeds)} seed(s) {seeds_text(campaign.seeds)}")]
    windowed = campaign.nodes_to_score < ALL_NODES
    if windowed:
        lines.append(f"kube-scheduler window "
                     f"{nodes_to_find(len(s.nodes), campaign.nodes_to_score)} nodes")
    if campaign.learn_every is not None:
        lines.append(f"workload learned every {campaign.learn_every:g}")
    remote = campaign.remote is not RemoteMode.OFF
    if remote:
        lines.append(f"remote slices {campaign.remote.value} ({', '.join(campaign.domains)} "
                     f"first); slices counted at the headline")
    title = "\n".join(lines)
    table = Table(title=title, caption=f"mean ± std over seeds; failed pods: mean per run; "
                                       f"decision: median; total wall time {wall:.1f} s")
    table.add_column("policy", no_wrap=True)
    if partial:
        table.add_column("runs", justify="right")
    protocol = campaign.mode is SimMode.PROTOCOL
    table.add_column("unallocated GPU %" if protocol else "peak GPU alloc. %", justify="right")
    for name in ("failed pods", *(("bounced pods",) if windowed else ()),
                 *(REMOTE_COLUMNS if remote else ()), "decision ms", "wall s"):
        table.add_column(name, justify="right")
    for p in stats:
        headline = (f"{p.mean_unallocated_gpu_pct:.2f} ± {p.std_unallocated_gpu_pct:.2f}"
                    if p.mean_unallocated_gpu_pct is not None
                    else f"{p.mean_peak_allocation_pct or 0.0:.2f}")
        done = (f"{p.runs} of {len(campaign.seeds)}",) if partial else ()
        bounced = (f"{p.mean_bounced_pods:.1f}",) if windowed else ()
        served = (f"{p.mean_local_slices_pct:.1f}", f"{p.mean_remote_slices:.1f}",
                  f"{p.mean_gpuless_pods:.1f}") if remote else ()
        table.add_row(p.policy, *done, headline, f"{p.mean_failed_pods:.1f}", *bounced,
                      *served, f"{p.decision_median_ms:.3f}", f"{p.wall_s:.1f}")
    return table


# -- tenants ---------------------------------------------------------------------------------------
def _tenanted(args: argparse.Namespace) -> tuple[Scenario, Tenancy] | None:
    """The scenario and tenancy to replay, when tenancy flags or keys are given."""
    asked = args.tenancy is not None or args.tenants is not None
    if asked and args.mode != SimMode.TIMED.value:
        raise InvalidInput("tenants are replayed in time: add --mode timed")
    if not asked and args.mode != SimMode.TIMED.value:
        return None
    if not asked and (args.pods is None or args.pods.suffix.lower() not in (".yaml", ".yml")):
        return None
    return tenancy_for(load(args), args.pods, args.tenancy, args.tenants)


def _simulate_tenants(args: argparse.Namespace, policies: Sequence[str], scenario: Scenario,
                      tenancy: Tenancy) -> int:
    """One replay with the cohorts (and, sharing fairly, one first come first served) and
    one without (same quotas), per policy and seed."""
    from gpupool.sim.tenants_report import (  # matplotlib: only once there is a plot to draw
        LIMITS_OPTIONAL,
        TABLE_OPTIONAL,
        limits_table,
        write_tenants,
    )
    from gpupool.sim.tenants_report import table as tenant_table

    started = time.perf_counter()
    config = Campaign(scenario, tuple(policies), args.seeds, SimMode.TIMED).config()
    variants = (tenancy, tenancy.without_cohorts()) if tenancy.borrows else (tenancy,)
    if tenancy.fair:  # and first come, first served, to show what fair sharing does
        variants = (tenancy, tenancy.without_fair_sharing(), *variants[1:])
    runs = [run_tenants(scenario, t, p, s, config, args.eviction_grace)
            for p in policies for s in args.seeds for t in variants]
    try:
        written = write_tenants(args.out, runs)
    except OSError as exc:
        raise InvalidInput(f"cannot write to {args.out}: {exc.strerror or exc}") from None
    title = (f"{scenario.name}: {len(scenario.nodes)} nodes, "
             f"{scenario.gpu_capacity_milli // 1000} GPUs, {len(scenario.pods)} pods, "
             f"tenants in timed mode, {time.perf_counter() - started:.1f} s")
    console = screen()
    more = f"--wide shows them; {args.out}/ has every column"
    for p in policies:
        for s in args.seeds:
            for run in (r for r in runs if r.policy == p and r.seed == s):
                show(console, tenant_table(run, f"{title}; policy {p}, seed {s}"),
                     optional=TABLE_OPTIONAL, wide=args.wide, more=more)
                if run.tenants:
                    show(console, limits_table(run, f"policy {p}, seed {s}"),
                         optional=LIMITS_OPTIONAL, wide=args.wide, more=more)
    console.print(wrote(written), soft_wrap=True)
    return 0
