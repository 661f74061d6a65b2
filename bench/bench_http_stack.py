"""Benchmark of the HTTP stack under the extender: uvicorn's C parser and event loop
(httptools, uvloop; what ``gpupool extender`` runs on, they are dependencies) against
its pure-Python fallback (h11 on asyncio), the baseline, in the same run.

    .venv/bin/python bench/bench_http_stack.py [--rounds 3] [--calls 3000]

The extender app (no cluster behind it) serves a bind call that is refused at once
(one small JSON body each way), so the figure is the stack's own cost per call. The
client, lean HTTP/1.1 on one kept connection as kube-scheduler's, runs in a child
process. The stacks alternate round by round (the machine's speed drifts); p50 and p99
per round, the server process's CPU per call, and the ratio to the baseline's p50.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import uvicorn

sys.path.insert(0, str(Path(__file__).parent))
from bench_extender import LoopbackClient, pct  # the scheduler stand-in

from gpupool.core.policies import DEFAULT_POLICY
from gpupool.extender.edge.app import build_app
from gpupool.extender.metrics import Metrics
from gpupool.extender.service import Extender, Settings
from gpupool.extender.state.cache import ClusterCache

STACKS = (("h11", "asyncio"), ("httptools", "uvloop"))  # baseline first
BODY = b'{"PodName":"p","PodNamespace":"bench","PodUID":"u","Node":"nowhere"}'
WARM = 300


def client_child(url: str, calls: int) -> None:
    """In a child process: ``calls`` bind calls, the round trips (µs) after warm-up."""
    client = LoopbackClient(url)
    times = []
    for _ in range(calls + WARM):
        t0 = time.perf_counter()
        client("bind", BODY)
        times.append(time.perf_counter() - t0)
    client.close()
    print(" ".join(f"{t * 1e6:.1f}" for t in times[WARM:]))


def serve_and_measure(http: str, loop: str, calls: int) -> tuple[list[float], float]:
    """(round trips in µs, the server process's CPU µs per call)."""
    app = build_app(Extender(ClusterCache(), Settings(DEFAULT_POLICY), Metrics()))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off",
                                           access_log=False, http=http, loop=loop))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        return client_run(f"http://127.0.0.1:{sock.getsockname()[1]}", calls)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def client_run(url: str, calls: int) -> tuple[list[float], float]:
    cpu = time.process_time()
    out = subprocess.run([sys.executable, __file__, "--client-child", url, str(calls)],
                         capture_output=True, text=True, check=True, timeout=600)
    per_call = (time.process_time() - cpu) * 1e6 / (calls + WARM)
    return [float(x) for x in out.stdout.split()], per_call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--client-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client_child:
        client_child(args.client_child[0], int(args.client_child[1]))
        return
    print(f"{'round':>5} {'stack':22} {'p50 µs':>8} {'p99 µs':>8} {'server CPU µs':>14}  "
          "p50 / h11's")
    for r in range(1, args.rounds + 1):
        p50 = {}
        for http, loop in STACKS:
            times, cpu = serve_and_measure(http, loop, args.calls)
            p50[http] = pct(times, 0.5)
            print(f"{r:5} {http + ' + ' + loop:22} {p50[http]:8.0f} {pct(times, 0.99):8.0f} "
                  f"{cpu:14.0f}  {p50[http] / p50['h11']:.2f}")


if __name__ == "__main__":
    main()
