"""How promptly Ctrl-C stops ``gpupool simulate``, against how long it would have run.

    .venv/bin/python bench/bench_interrupt.py [--tries 3] [--workers 2] [--after 2.0]

Starts a long campaign (fgd-balance, 400 seeds, 200 synthetic nodes, ``--workers``
processes) as a real process, waits until its workers run and ``--after`` seconds
more, sends SIGINT, and prints per try: seconds from SIGINT to exit (outputs of the
finished runs written included), the exit code, how many runs had finished, and the
baseline measured in the same run — the seconds one run takes, which is what waiting
for the runs in progress (let alone the queued ones) would add. Linux only (reads
``/proc`` to see the workers).
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CAMPAIGN = ["--policy", "fgd-balance", "--seeds", "1-400", "--synthetic-nodes", "200"]


def children(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []


def one_try(workers: int, after_s: float, out: Path) -> tuple[float, int, int]:
    proc = subprocess.Popen([sys.executable, "-m", "gpupool.cli.main", "simulate", *CAMPAIGN,
                             "--workers", str(workers), "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while len(children(proc.pid)) < workers:
        time.sleep(0.02)
    time.sleep(after_s)
    sent = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    took = time.perf_counter() - sent
    summary = out / "summary.json"
    finished = len(json.loads(summary.read_text())["runs"]) if summary.exists() else 0
    return took, proc.returncode, finished


def one_run_s() -> float:
    """Seconds one (policy, seed) run of the campaign takes, in one process."""
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "gpupool.cli.main", "simulate", "--policy",
                        "fgd-balance", "--seeds", "1", "--synthetic-nodes", "200", "--workers",
                        "1", "--out", folder], check=True, capture_output=True)
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--after", type=float, default=2.0, metavar="SECONDS")
    args = parser.parse_args()
    stops = []
    for k in range(args.tries):
        with tempfile.TemporaryDirectory() as folder:
            took, code, finished = one_try(args.workers, args.after, Path(folder) / "out")
        stops.append(took)
        print(f"try {k + 1}: stopped {took:.2f} s after SIGINT, exit {code}, "
              f"{finished} runs written")
    run_s = one_run_s()
    print(f"SIGINT to exit: median {statistics.median(stops):.2f} s, max {max(stops):.2f} s; "
          f"one run alone (process start included): {run_s:.2f} s; the campaign: 400 runs")


if __name__ == "__main__":
    main()
