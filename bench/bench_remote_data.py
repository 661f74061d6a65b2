"""Benchmark of the remote-slice data path: terminator overhead, heartbeats, start-up.

    .venv/bin/python bench/bench_remote_data.py [--calls 2000] [--rounds 3]
        [--sessions 1000] [--heartbeat-seconds 1] [--measure-seconds 20] [--starts 5]

Everything runs as it is deployed, as real processes on loopback: ``gpupool
slice-server --provider stub`` (with the STUB provider as its child) and ``gpupool
slice-client``, with session certificates from a CA made for the run.

**Per-call overhead of the TLS terminators.** One workload (this process, the stub
protocol over a blocking socket) makes ``--calls`` calls straight to the stub's loopback
port (the data plane without gpupool) and the same calls through the sidecar's loopback
port (sidecar -> mutual TLS -> slice server -> stub), the two paths alternating in
``--rounds`` rounds. Calls: ``usage`` (a small request and answer), a 4 KiB write, a
4 KiB read and a 1 MiB write. Printed per call: p50 and p99 µs on each path, and the
p50 difference (what the two terminators and the extra hops add to one call).

**Heartbeat cost at ``--sessions`` sessions.** One slice server; a second process opens
``--sessions`` control channels to it with the sidecar's own code (``SliceClient.open``
and ``channel.heartbeats``), each heartbeating both ways every ``--heartbeat-seconds``.
After all are up and a settling pause, the CPU time of each process (user + system,
``/proc/<pid>/stat``) over ``--measure-seconds`` is printed as CPU seconds per second,
and per heartbeat exchanged; the same is measured with no session first (the baseline:
what the server does idle).

**Time from start to slice usable.** ``--starts`` times: the slice server and the
sidecar started at the same moment (as when the server pod and the client pod start
together), and the time until the workload's first call through the sidecar's data
plane is answered; also the time until the sidecar's ``/ready`` said 200.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpupool.remote import channel
from gpupool.remote.client import ClientConfig, SliceClient
from gpupool.remote.credentials import CredentialPaths
from gpupool.remote.stubclient import StubClient
from gpupool.security import certs, sessions

from machine import line as machine_line

POD_UID = "0c5d7a7e-1d1b-4c3e-9a8f-5b9d2a6f7e01"
GPU = "GPU-5a1c0de0-0000-4000-8000-000000000001"
TICK = os.sysconf("SC_CLK_TCK")
_ports = iter(range(21000 + os.getpid() % 500 * 20, 65000))


def port() -> int:
    return next(_ports)


def credentials(root: Path) -> tuple[Path, Path]:
    ca = certs.new_ca("gpupool-ca", time.time())
    dirs = []
    for name, pair in (("server", sessions.issue_server(ca, POD_UID, time.time())),
                       ("client", sessions.issue_client(ca, POD_UID, time.time()))):
        d = root / name
        d.mkdir(parents=True)
        (d / "tls.crt").write_text(pair.cert)
        (d / "tls.key").write_text(pair.key)
        (d / "ca.crt").write_text(ca.cert)
        dirs.append(d)
    return dirs[0], dirs[1]


def gpupool(args: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "gpupool.cli.main", *args],
                            stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


class Slice:
    """A slice server (stub provider) and, optionally, its sidecar."""

    def __init__(self, root: Path, heartbeat_s: float = 5.0, sidecar: bool = True,
                 memory_mib: int = 64):
        server_dir, client_dir = credentials(root)
        self.tls, self.stub, self.data = port(), port(), port()
        self.server_status, self.client_status = port(), port()
        beat = ["--heartbeat-seconds", str(heartbeat_s), "--heartbeat-deadline-seconds",
                str(heartbeat_s * 10)]
        self.started = time.perf_counter()
        self.server = gpupool(
            ["slice-server", "--pod-uid", POD_UID, "--pod-name", "bench/w", "--container", "main",
             "--gpu-uuid", GPU, "--memory-mib", str(memory_mib), "--core-pct", "50",
             "--host", "127.0.0.1", "--port", str(self.tls), "--loopback-port", str(self.stub),
             "--status-address", "127.0.0.1", "--status-port", str(self.server_status),
             "--credentials-dir", str(server_dir), "--connect-deadline-seconds", "3600",
             "--log-level", "WARNING", *beat], root / "server.log")
        self.client = gpupool(
            ["slice-client", "--pod-uid", POD_UID, "--slice-server", f"127.0.0.1:{self.tls}",
             "--credentials-dir", str(client_dir), "--host", "127.0.0.1", "--port",
             str(self.data), "--status-address", "127.0.0.1", "--status-port",
             str(self.client_status), "--log-level", "WARNING", *beat],
            root / "client.log") if sidecar else None
        self.client_dir = client_dir

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.server_status}/status",
                                    timeout=10) as answer:
            return json.loads(answer.read())  # type: ignore[no-any-return]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.client_status}/ready",
                                        timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def wait(self, check: Callable[[], bool], timeout_s: float = 60.0) -> float:
        deadline = time.perf_counter() + timeout_s
        while not check():
            if time.perf_counter() > deadline:
                raise SystemExit(f"not ready within {timeout_s} s")
            time.sleep(0.002)
        return time.perf_counter() - self.started

    def close(self) -> None:
        for proc in (self.client, self.server):
            if proc is not None:
                stop(proc)


def answers(port_: int) -> Callable[[], bool]:
    def check() -> bool:
        try:
            with StubClient("127.0.0.1", port_, timeout_s=2) as c:
                c.usage()
            return True
        except (OSError, ConnectionError):
            return False
    return check


# -- 1. per-call overhead ---------------------------------------------------------------------
def calls(client: StubClient, small_buf: int, big: int) -> dict[str, Callable[[], object]]:
    small = b"x" * 4096
    large = b"y" * (1 << 20)
    return {"usage": client.usage,
            "write 4 KiB": lambda: client.write(small_buf, small),
            "read 4 KiB": lambda: client.read(small_buf, 4096),
            "write 1 MiB": lambda: client.write(big, large)}


def timed(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def overhead(root: Path, n: int, rounds: int) -> None:
    s = Slice(root / "overhead")
    try:
        s.wait(answers(s.data))
        paths = {"direct": StubClient("127.0.0.1", s.stub),
                 "via TLS": StubClient("127.0.0.1", s.data)}
        buffers = {path: (c.alloc(4096), c.alloc(1 << 20)) for path, c in paths.items()}
        figures: dict[tuple[str, str], list[float]] = {}
        for _ in range(rounds):
            for path, c in paths.items():
                for name, fn in calls(c, *buffers[path]).items():
                    count = n if "1 MiB" not in name else max(10, n // 20)
                    figures.setdefault((name, path), []).extend(timed(fn, count))
        print("\nper call (µs)              direct p50 / p99    via TLS p50 / p99    added (p50)")
        for name in ("usage", "write 4 KiB", "read 4 KiB", "write 1 MiB"):
            d, t = figures[(name, "direct")], figures[(name, "via TLS")]
            print(f"  {name:<24} {pct(d, .5):>9.0f} / {pct(d, .99):<8.0f} "
                  f"{pct(t, .5):>9.0f} / {pct(t, .99):<8.0f} {pct(t, .5) - pct(d, .5):>9.0f} "
                  f"({pct(t, .5) / pct(d, .5):.1f}x)")
    finally:
        s.close()


# -- 2. heartbeat cost ---------------------------------------------------------------------------
def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


async def hold_sessions(client_dir: Path, tls_port: int, sessions_: int, beat_s: float,
                        out: Path) -> None:
    """The sidecar's control channels, ``sessions_`` of them, heartbeating until killed;
    the heartbeats received so far written to ``out`` every second."""
    paths = CredentialPaths(client_dir / "tls.crt", client_dir / "tls.key",
                            client_dir / "ca.crt")
    timing = channel.Timing(beat_s, beat_s * 10)
    client = SliceClient(ClientConfig(POD_UID, "127.0.0.1", tls_port, paths, timing=timing))
    beats = 0

    def heard() -> None:
        nonlocal beats
        beats += 1

    tasks = []
    for _ in range(sessions_):  # each heartbeats from the moment it is open
        reader, writer = await client.open("control")
        tasks.append(asyncio.create_task(channel.heartbeats(reader, writer, timing, heard)))
    print(json.dumps({"open": len(tasks)}), flush=True)
    while not all(t.done() for t in tasks):
        await asyncio.sleep(0.5)
        out.write_text(str(beats))


def heartbeats(root: Path, n: int, beat_s: float, measure_s: float) -> None:
    s = Slice(root / "heartbeat", heartbeat_s=beat_s, sidecar=False)
    try:
        time.sleep(2.0)
        s.wait(answers(s.stub))
        server_idle = cpu_s(s.server.pid)
        time.sleep(measure_s)
        idle = (cpu_s(s.server.pid) - server_idle) / measure_s
        counts = root / "beats"
        holder = subprocess.Popen(
            [sys.executable, __file__, "--hold", str(s.client_dir), str(s.tls), str(n),
             str(beat_s), str(counts)], stdout=subprocess.PIPE, text=True,
            start_new_session=True)
        try:
            assert holder.stdout is not None
            t0 = time.perf_counter()
            first = json.loads(holder.stdout.readline())
            opened_s = time.perf_counter() - t0
            time.sleep(3 * beat_s)
            cs, ss, t0 = cpu_s(holder.pid), cpu_s(s.server.pid), time.perf_counter()
            b0 = int(counts.read_text())
            time.sleep(measure_s)
            took = time.perf_counter() - t0
            client = (cpu_s(holder.pid) - cs) / took
            server = (cpu_s(s.server.pid) - ss) / took
            beats = int(counts.read_text()) - b0
            live = s.status()["sessions"]["control"]
        finally:
            stop(holder)
        print(f"\nheartbeats: {first['open']} sessions opened in {opened_s:.1f} s ({live} open "
              f"at the end), one beat each way every {beat_s:g} s, measured over {took:.0f} s "
              f"({beats} beats received by the sidecars)")
        print(f"  slice server: {server:.3f} CPU s/s with the sessions, {idle:.3f} idle "
              f"(no session); {(server - idle) * took / max(1, beats) * 1e6:.0f} µs per beat")
        print(f"  sidecar side: {client:.3f} CPU s/s for all {n} sessions; "
              f"{client / max(1, beats / took) * 1e6:.0f} µs per beat")
    finally:
        s.close()


# -- 3. start-up --------------------------------------------------------------------------------
def startup(root: Path, starts: int) -> None:
    usable, ready = [], []
    for i in range(starts):
        s = Slice(root / f"start-{i}")
        try:
            usable.append(s.wait(answers(s.data)))
            ready.append(s.wait(s.ready))
        finally:
            s.close()
    print(f"\nstart to slice usable (server and sidecar started together, {starts} starts): "
          f"median {statistics.median(usable):.2f} s (min {min(usable):.2f}, max "
          f"{max(usable):.2f}); sidecar /ready 200 at median {statistics.median(ready):.2f} s")


def main() -> None:
    if sys.argv[1:2] == ["--hold"]:
        d, tls, n, beat, out = sys.argv[2:7]
        asyncio.run(hold_sessions(Path(d), int(tls), int(n), float(beat), Path(out)))
        return
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sessions", type=int, default=1000)
    p.add_argument("--heartbeat-seconds", type=float, default=1.0)
    p.add_argument("--measure-seconds", type=float, default=20.0)
    p.add_argument("--starts", type=int, default=5)
    p.add_argument("--only", choices=("overhead", "heartbeats", "startup"), action="append")
    args = p.parse_args()
    only = set(args.only or ("overhead", "heartbeats", "startup"))
    print(machine_line("before"))
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-remote-") as tmp:
        root = Path(tmp)
        if "overhead" in only:
            overhead(root, args.calls, args.rounds)
        if "heartbeats" in only:
            heartbeats(root, args.sessions, args.heartbeat_seconds, args.measure_seconds)
        if "startup" in only:
            startup(root, args.starts)
    print(machine_line("after"))


if __name__ == "__main__":
    main()
