"""``gpupool simulate --gangs N``: gangs placed whole against placed pod by pod.

Generates ``N`` jobs (``sim.gangload``: gangs of 2–64 members, single pods, some of them
burstable) for the cluster of ``--nodes`` (or the built-in synthetic one) and replays them
per policy and seed in both modes of ``sim.gangs``; prints one row per policy and mode
(means over the seeds) and writes every run to ``<out>/gangs.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence

from rich.table import Table

from gpupool.cli.tables import screen, show
from gpupool.core.errors import InvalidInput
from gpupool.core.policies import make_policy
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.state import ClusterState
from gpupool.core.workload import TargetWorkload
from gpupool.sim.gangload import GangMix, generate
from gpupool.sim.gangs import GangRun, Mode, replay
from gpupool.sim.scenario import Scenario
from gpupool.sim.sources import read_cluster
from gpupool.sim.synthetic import DEFAULT_NODES, synthetic_scenario

COLUMNS = (("unalloc. while waiting %", "unallocated_waiting_pct"),
           ("idle while waiting %", "idle_waiting_pct"),
           ("partial gangs", "partial_gangs"), ("partial GPU-h", "partial_gpu_hours"),
           ("gang wait p50 s", "gang_wait_median_s"), ("gang wait p90 s", "gang_wait_p90_s"),
           ("never started", "never_started"), ("bursts granted", "bursts_granted"),
           ("bursts reclaimed", "bursts_reclaimed"), ("wall s", "wall_s"))
OPTIONAL = ("wall s", "bursts reclaimed", "bursts granted", "never started", "partial GPU-h",
            "gang wait p90 s")


def simulate_gangs(args: argparse.Namespace, policies: Sequence[str]) -> int:
    """The runs, the table and ``gangs.json``."""
    if args.pods is not None or args.mix is not None:
        raise InvalidInput("--gangs generates its own workload; it does not go with --pods "
                           "or --mix (--nodes chooses the cluster)")
    started = time.perf_counter()
    scenario = _cluster(args)
    state = ClusterState(scenario.nodes)
    gpus = sum(len(n.gpus) for n in scenario.nodes)
    mix = GangMix(jobs=args.gangs, load=args.gang_load)
    runs: list[GangRun] = []
    for seed in args.seeds:
        jobs = generate(mix, gpus, seed)
        workload = TargetWorkload.from_requests(m for j in jobs for m in j.members)
        for name in policies:
            policy = make_policy(name, PolicyConfig(workload, dict(args.weight)))
            runs += [replay(state, jobs, mode, policy, name, seed) for mode in Mode]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "gangs.json"
    try:
        path.write_text(json.dumps([r.summary() for r in runs], indent=1) + "\n")
    except OSError as exc:
        raise InvalidInput(f"cannot write to {args.out}: {exc.strerror or exc}") from None
    title = (f"{scenario.name}: {len(scenario.nodes)} nodes, {gpus} GPUs; {args.gangs} jobs "
             f"(gangs of 2-64, single pods), load {args.gang_load:g}; "
             f"{len(args.seeds)} seed(s); {time.perf_counter() - started:.1f} s")
    show(screen(), _table(runs, policies, title), optional=OPTIONAL, wide=args.wide,
         more="--wide shows them")
    print(f"wrote {path.name} to {args.out}")
    return 0


def _cluster(args: argparse.Namespace) -> Scenario:
    """The nodes of ``--nodes``, or the built-in synthetic cluster's."""
    if args.nodes is None:
        return synthetic_scenario(args.synthetic_nodes or DEFAULT_NODES)
    nodes, _ = read_cluster(args.nodes)
    return Scenario(args.nodes.stem, tuple(nodes), ())


def _table(runs: Sequence[GangRun], policies: Sequence[str], title: str) -> Table:
    table = Table(title=title, caption="means over seeds; waits of gangs (start - arrival)")
    table.add_column("policy", no_wrap=True)
    table.add_column("mode", no_wrap=True)
    for header, _ in COLUMNS:
        table.add_column(header, justify="right")
    for name in policies:
        for mode in Mode:
            mine = [r.summary() for r in runs if r.policy == name and r.mode == mode.value]
            table.add_row(name, mode.value, *(
                f"{statistics.mean(float(str(r[key])) for r in mine):.1f}"
                for _, key in COLUMNS))
    return table
