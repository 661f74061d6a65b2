"""Benchmark of the controller's metrics: what working out the cluster figures costs
against the reconcile round they follow.

    .venv/bin/python bench/bench_controller_figures.py [--nodes 250 1000] [--repeat 5]

For N nodes × 8 GPUs of 80 GiB in 4 pools and one placed pod per GPU (a 10 GiB, 30 %
slice, 20 tenants, 2 groups with quotas), it prints the median of ``--repeat`` runs of:

* ``round``: ``observe`` + ``reconcile`` of the same objects (the baseline, in the same
  run: what a controller round computes before it writes);
* ``figures``: ``controller.figures.figures`` with a warm ``DeviceMemo`` (as every round
  after the first): quota per scope, GPUs, allocation and the core's fragmentation per
  model and pool, pending pods, stale and isolated GPUs — and the ratio.

The controller works the figures out at most every ``--metrics-every`` seconds (10), so
their share of its CPU is at most ratio × round / 10 s. The machine's speed is printed
before and after (``bench/machine.py``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.controller.builders

from gpupool.controller.figures import DeviceMemo, Heartbeats, figures
from gpupool.controller.observed import observe
from gpupool.controller.reconcile import reconcile
from tests.controller.builders import GIB, device, group, placed_pod, slices

from machine import line


def cluster(nodes: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                 list[dict[str, Any]]]:
    devices = [device(f"n{n}", i, labels={"gpupool.io/pool": f"pool-{n % 4}"})
               for n in range(nodes) for i in range(8)]
    for k, d in enumerate(devices):
        d["metadata"]["resourceVersion"] = str(k + 1)
    pods = [placed_pod(f"p{n}-{i}", f"tenant-{n % 20}", f"n{n}",
                       slices(f"n{n}", (i, 10 * GIB, 30)),
                       group_name="team-a" if n % 2 else "team-b")
            for n in range(nodes) for i in range(8)]
    groups = [group("team-a", nodes=[f"n{n}" for n in range(1, nodes, 2)],
                    quota={"gpus": 4 * nodes}),
              group("team-b", nodes=[f"n{n}" for n in range(0, nodes, 2)],
                    quota={"memoryMiB": 40 * GIB * nodes})]
    return devices, groups, pods


def timed(work: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def run(nodes: int, repeat: int) -> None:
    devices, groups, pods = cluster(nodes)
    memo = DeviceMemo()
    memo.read(devices)

    def round_() -> object:
        return reconcile(observe(devices, [], groups, pods, None), "2026-01-01T00:00:00Z")

    observed = observe(devices, [], groups, pods, None)

    def figures_() -> object:
        beats = Heartbeats(memo.read(devices), time.time(), 120.0)
        return figures(observed, pods, {}, "gpupool.io/pool", beats)

    base = timed(round_, repeat)
    figs = timed(figures_, repeat)
    print(f"{nodes:5d} nodes {8 * nodes:6d} GPUs {len(pods):6d} pods  round {base:8.1f} ms  "
          f"figures {figs:8.1f} ms  figures/round {figs / base:5.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[250, 1000])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(line("before"))
    for n in args.nodes:
        run(n, args.repeat)
    print(line("after"))


if __name__ == "__main__":
    main()
