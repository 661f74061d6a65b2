"""Benchmark: from a remote-required client pod's creation to its remote slice usable.

    .venv/bin/python bench/bench_remote_start.py [--runs 20] [--gpus 8]

The whole control path on one machine (``tests/remote/control_path.py``): the FAKE API
server in a child process; ``gpupool webhook`` (HTTPS), ``gpupool extender
--remote-slices`` (plain HTTP) and ``gpupool controller --remote-provider stub`` (leader
election on) each in a process of its own; ``gpupool slice-server --provider stub`` and
``gpupool slice-client`` started from the pods the controller and the webhook wrote. This
process plays the API server's admission step (the fake calls no webhook), kube-scheduler
(filter, prioritize, bind once its watch sees the pod) and kubelet (a container starts
once its pod is on a node and its volumes' Secrets and ConfigMaps exist; ports, volumes
and Service names mapped onto the host), and is the workload (the stub protocol through
the sidecar's loopback port). Kubelet's container start (sandbox, image, runtime) and
its probe periods are not modelled: add your kubelet's to the figures.

Each run: a client pod asking 1,024 MiB and 10 % of a GPU, pinned to a node without
GPUs, is admitted and created; the stages, p50 / p90 over ``--runs`` runs:

* **admission**: mutate and validate over HTTPS, the patch applied, the pod stored;
* **scheduling + bind**: the scheduler stand-in's watch sees the pod, the extender's
  filter, prioritize and bind answer (the signed decision written);
* **controller reaction**: until the server pod, its Service, both session certificates
  and the revocation list exist (kubelet starts the server then);
* **server start to listening**: the slice server process (and the stub it starts) until
  its ``/healthz`` answers 200;
* **sidecar handshake**: until the sidecar's ``/ready`` answers 200 (the sidecar was
  started when the client pod was bound and its certificate issued);
* **first call**: the workload's first alloc, write, read and checksum through the
  sidecar.

After each run the server pod is reported ready (kubelet's probe), the client pod is
deleted, and the time until the controller deleted the server pod is recorded (release).
The first run after the components start is reported apart (it makes the slice CA).

Baselines in the same run, alternating with the runs: ``bench_remote_data.py``'s start
to usable (the server and the sidecar started together with certificates on disk, until
the first call answers) and a process start (``gpupool --help``, as the stand-in starts
the containers' command).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.remote.control_path
sys.path.insert(0, str(REPO / "testing"))  # gpupool_testing: the tests' builders import it

from bench_extender import FakeApi  # noqa: E402
from bench_remote_data import Slice, answers  # noqa: E402

from tests.remote.control_path import (  # noqa: E402
    Run,
    control_path,
    gpupool_argv,
    seed_objects,
)

from machine import line as machine_line  # noqa: E402

STAGES = ("admission", "scheduling + bind", "controller reaction", "server start to listening",
          "sidecar handshake", "first call", "total")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def process_start() -> float:
    t0 = time.perf_counter()
    subprocess.run([*gpupool_argv(), "--help"], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def baseline(root: Path) -> float:
    """bench_remote_data's start to usable: server and sidecar started together."""
    s = Slice(root)
    try:
        return s.wait(answers(s.data))
    finally:
        s.close()


def row(name: str, values: list[float]) -> str:
    return (f"  {name:<38} {pct(values, .5) * 1e3:>8.0f} {pct(values, .9) * 1e3:>8.0f} "
            f"{min(values) * 1e3:>8.0f} {max(values) * 1e3:>8.0f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--gpus", type=int, default=8, help="GPUs of the one GPU node")
    p.add_argument("--controller-metrics-every", type=float, default=10.0,
                   metavar="SECONDS", help="the controller's --metrics-every (default 10, "
                   "the controller's own)")
    args = p.parse_args()
    print(machine_line("before"))
    lines = (json.dumps({"kind": plural, "object": obj})
             for plural, obj in seed_objects(args.gpus))
    fake = FakeApi(lines)
    runs: list[Run] = []
    released, starts, bases = [], [], []
    try:
        with tempfile.TemporaryDirectory(prefix="gpupool-bench-start-") as tmp:
            root = Path(tmp)
            t0 = time.perf_counter()
            with control_path(fake.url, root / "cluster",
                              args.controller_metrics_every) as driver:
                print(f"webhook, extender and controller ready in "
                      f"{time.perf_counter() - t0:.1f} s")
                first = driver.run("first")
                driver.report_ready(first)
                driver.release(first)
                for i in range(args.runs):
                    run = driver.run(f"client-{i}")
                    driver.report_ready(run)
                    released.append(driver.release(run))
                    runs.append(run)
                    bases.append(baseline(root / f"baseline-{i}"))
                    starts.append(process_start())
    finally:
        fake.close()
    figures = {s: [r.stages()[s] for r in runs] for s in STAGES}
    print(f"\nclient pod created -> slice usable, {args.runs} runs (ms)")
    print(f"  {'stage':<38} {'p50':>8} {'p90':>8} {'min':>8} {'max':>8}")
    for s in STAGES:
        print(row(s, figures[s]))
    side = [r.sidecar_started - r.bound for r in runs]
    print(row("(bound -> sidecar started)", side))
    e2e = [r.usable - r.server_started for r in runs]
    print(row("server started -> usable, in these runs", e2e))
    print(row("release: pod deleted -> server pod deleted", released))
    print("\nbaselines, alternating with the runs (ms)")
    print(row("server + sidecar started -> usable", bases))
    print(row("process start: gpupool --help", starts))
    print(f"\nfirst run after start (makes the slice CA): total "
          f"{first.stages()['total'] * 1e3:.0f} ms")
    print(f"total / baseline at p50: {pct(figures['total'], .5) / pct(bases, .5):.2f}x; "
          f"median total {statistics.median(figures['total']) * 1e3:.0f} ms")
    print(machine_line("after"))


if __name__ == "__main__":
    main()
