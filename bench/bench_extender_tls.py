"""Benchmark of the extender's hardening: HTTPS against HTTP per pod, and oversized bodies.

    .venv/bin/python bench/bench_extender_tls.py [--nodes 1000] [--pods 300] [--rounds 3]
        [--no-https] [--no-oversize] [--oversize-nodes 5000] [--oversize-pods 50000]

**HTTPS vs HTTP, side by side in one run.** One extender (in this process, wired as
``gpupool extender`` wires it, over the fake API server in a child process) serves its
verbs on two ports at once: plain HTTP, and mutual TLS with the certificates it made
for itself. A scheduler stand-in in a child process (one kept-alive connection, as
kube-scheduler's Go client keeps one; over TLS it presents the scheduler's client
certificate from the Secret the extender made) schedules ``--pods`` new pods per round
(filter with kube-scheduler's default share of the node names, prioritize, bind), the
two transports alternating, ``--rounds`` rounds each. Printed per transport: the
extender process's CPU ms per pod (every thread: verbs, binds, watches; the client is
another process), p50/p99 ms per pod, pods/s, and the ratios HTTPS / HTTP; then the
server CPU of one new connection (TCP, or TCP plus a full TLS handshake with client
certificate) from ``--connections`` connections each making one small call.

**Oversized bodies.** ``gpupool extender`` as its own process, as deployed (mutual TLS
on one port, probes on another), over a fake API server holding ``--oversize-nodes``
nodes and ``--oversize-pods`` pods (the size its memory is sized for). A prober calls
``/healthz`` every 10 ms on a kept-alive connection throughout. Phases: idle (the
baseline), one 2,000,000-victim ``/preempt``, four concurrent 200 MB ``/filter`` bodies,
a chunked 256 MB ``/filter`` (no length announced), and four concurrent largest
legitimate filters (every node name, a 1.5 MiB pod). Printed per phase: the answer,
its time, ``/healthz`` p50/p99/max against the idle baseline, and the extender's
resident memory; at the end its peak (VmHWM) against the Deployment's 1 GiB limit.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec
from bench_extender import (
    GPUS,
    NAMESPACE,
    ApiClock,
    FakeApi,
    LoopbackClient,
    Outcome,
    PodCall,
    cluster_lines,
    drive,
    pct,
    pod_calls,
    summary,
    warm_up,
    wired,
)

from gpupool.core.policies import DEFAULT_POLICY
from gpupool.extender.edge.app import build_verbs
from gpupool.extender.edge.connections import ConnectionRules
from gpupool.extender.edge.server import ThreadedServer
from gpupool.extender.edge.tls import CLIENT_SECRET, ReloadingContext, TlsSource
from gpupool.extender.state.feeds import long_lived, start_feeds
from gpupool.kube.api import KubeApi
from gpupool.security.certs import CLIENT_SCHEDULER
from gpupool.sim.window import ADAPTIVE, nodes_to_find

from machine import line as machine_line

SERVICE_NAME = f"gpupool-extender.{NAMESPACE}.svc"
MIB = 1024 * 1024
LIMIT_MIB = 1024  # the Deployment's memory limit


# -- the scheduler stand-in over TLS --------------------------------------------------------
class TlsLoopbackClient(LoopbackClient):
    """``LoopbackClient`` over mutual TLS (kube-scheduler's tlsConfig: caFile, certFile,
    keyFile; the Service's name checked against the certificate)."""

    def __init__(self, url: str, tls_dir: str):
        host, port = url.split("://")[1].rsplit(":", 1)
        ctx = ssl.create_default_context(cafile=f"{tls_dir}/ca.crt")
        ctx.load_cert_chain(f"{tls_dir}/tls.crt", f"{tls_dir}/tls.key")
        raw = socket.create_connection((host, int(port)))
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = ctx.wrap_socket(raw, server_hostname=SERVICE_NAME)
        self.host = SERVICE_NAME.encode()


def client_for(url: str, tls_dir: str) -> LoopbackClient:
    return TlsLoopbackClient(url, tls_dir) if url.startswith("https") else LoopbackClient(url)


def child(url: str, calls_path: str, tls_dir: str, mode: str) -> None:
    """In a child process: schedule the pods (``drive``) or open connections (``connect``:
    the count is in ``calls_path``); print the result."""
    if mode == "connect":
        count = int(Path(calls_path).read_text())
        start = time.perf_counter()
        for _ in range(count):
            client = client_for(url, tls_dir)
            client("bind", b"{}")
            client.close()
        print(json.dumps({"seconds": time.perf_counter() - start}))
        return
    calls = msgspec.msgpack.decode(Path(calls_path).read_bytes(), type=list[PodCall])
    client = client_for(url, tls_dir)
    print(msgspec.json.encode(drive(client, calls)).decode())
    client.close()


def in_child(url: str, payload: bytes, tls_dir: str, mode: str) -> bytes:
    with tempfile.NamedTemporaryFile() as f:
        f.write(payload)
        f.flush()
        out = subprocess.run([sys.executable, __file__, "--child", url, f.name, tls_dir, mode],
                             capture_output=True, check=True, timeout=900)
    return out.stdout.splitlines()[-1]


# -- HTTPS vs HTTP -----------------------------------------------------------------------------
def write_client_files(kube: KubeApi, folder: str) -> None:
    data, _ = kube.get_secret_data(NAMESPACE, CLIENT_SECRET)
    for name in ("tls.crt", "tls.key", "ca.crt"):
        Path(folder, name).write_text(data[name])


def https_vs_http(nodes: int, pods: int, rounds: int, connections: int, seed: int) -> None:
    busy = int(nodes * GPUS * 0.3 / 0.25)
    api = FakeApi(cluster_lines(nodes, busy, 0, seed))
    kube = KubeApi.connect(server=api.url)
    ext = wired(kube, DEFAULT_POLICY, seed)
    tls = ReloadingContext(TlsSource(NAMESPACE).material(kube, time.time()))
    folder = tempfile.TemporaryDirectory()
    write_client_files(kube, folder.name)
    with long_lived():
        feeds = start_feeds(kube, ext.cache, watch_timeout_s=30)
        ext.refresh_policy()
        ext.warm()
    clock = ApiClock(kube)
    clock.follow(ext)
    names = sorted(ext.cache.state.index)
    warm_up(ext, api, names, DEFAULT_POLICY, "shuffled")
    window = nodes_to_find(len(names), ADAPTIVE) if len(names) >= 1000 else 0
    rng = random.Random(seed)
    rules = ConnectionRules(client_names=frozenset({CLIENT_SCHEDULER}))
    results: dict[str, list[dict[str, float]]] = {"http": [], "https": []}
    with ThreadedServer(build_verbs(ext)) as plain, \
            ThreadedServer(build_verbs(ext), tls=tls.listening, rules=rules) as secure:
        urls = {"http": plain.url, "https": secure.url}
        for r in range(rounds):
            for mode in (("http", "https") if r % 2 == 0 else ("https", "http")):
                calls = pod_calls(api, names, pods, f"{mode}{r}", rng, "shuffled", window)
                results[mode].append(run_round(urls[mode], calls, clock, folder.name))
        per_connection = {mode: connect_cost(urls[mode], connections, folder.name)
                          for mode in ("http", "https")}
    feeds.stop(timeout_s=0.0)
    kube.close()
    api.close()
    folder.cleanup()
    report_transport(nodes, window or nodes, pods, results, per_connection)


def run_round(url: str, calls: list[PodCall], clock: ApiClock, tls_dir: str
              ) -> dict[str, float]:
    clock.bind_waits.clear()
    cpu = time.process_time()
    out = in_child(url, msgspec.msgpack.encode(calls), tls_dir, "drive")
    cpu = time.process_time() - cpu  # this process: the extender (the client is a child)
    outcomes, wall = msgspec.json.decode(out, type=tuple[list[Outcome], float])
    return summary(outcomes, wall, clock.bind_waits, cpu)


def connect_cost(url: str, count: int, tls_dir: str) -> dict[str, float]:
    """Server CPU and client wall time per new connection making one small call."""
    cpu = time.process_time()
    out = json.loads(in_child(url, str(count).encode(), tls_dir, "connect"))
    return {"cpu_ms": (time.process_time() - cpu) * 1e3 / count,
            "wall_ms": out["seconds"] * 1e3 / count}


def report_transport(nodes: int, sent: int, pods: int, results: dict[str, list[dict[str, float]]],
                     per_connection: dict[str, dict[str, float]]) -> None:
    print(f"\n{nodes} nodes × {GPUS} GPUs, {sent} node names per filter, {pods} pods a round; "
          "rounds alternate HTTP and HTTPS (mutual TLS), one kept-alive connection each")
    print(f"{'transport':10} {'round':>5} {'CPU ms/pod':>11} {'total p50/p99':>15} "
          f"{'own p50/p99':>15} {'pods/s':>7} {'bound':>6}")
    for mode, rows in results.items():
        for k, r in enumerate(rows):
            print(f"{mode:10} {k:5d} {r['cpu_ms']:11.2f} {r['total_p50']:7.2f}/"
                  f"{r['total_p99']:6.2f} {r['own_p50']:7.2f}/{r['own_p99']:6.2f} "
                  f"{r['pods_per_s']:7.0f} {r['bound']:6.0f}")
    cpu = {m: sorted(r["cpu_ms"] for r in rows) for m, rows in results.items()}
    med = {m: v[len(v) // 2] for m, v in cpu.items()}
    p99 = {m: sorted(r["total_p99"] for r in rows)[len(rows) // 2] for m, rows in results.items()}
    print(f"median CPU ms per pod: HTTP {med['http']:.2f}, HTTPS {med['https']:.2f} "
          f"(ratio {med['https'] / med['http']:.2f}, +{med['https'] - med['http']:.2f} ms); "
          f"median p99: HTTP {p99['http']:.2f}, HTTPS {p99['https']:.2f} ms")
    h, s = per_connection["http"], per_connection["https"]
    print(f"a new connection and one small call: server CPU {h['cpu_ms']:.2f} ms (TCP) vs "
          f"{s['cpu_ms']:.2f} ms (TLS handshake with client certificate); client wall "
          f"{h['wall_ms']:.2f} vs {s['wall_ms']:.2f} ms")


# -- oversized bodies ----------------------------------------------------------------------------
class Extender:
    """``gpupool extender`` in its own process."""

    def __init__(self, api_url: str):
        self.port, self.probes = free_port(), free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpupool.cli.main", "extender", "--server", api_url,
             "--host", "127.0.0.1", "--port", str(self.port), "--probe-port", str(self.probes),
             "--max-nodes", "5000", "--log-level", "ERROR"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 300
        while not self.ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the extender did not start: {self.proc.stderr.read()!r}"
                                   if self.proc.stderr else "the extender did not start")
            time.sleep(0.2)

    def ready(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.probes), timeout=1) as s:
                s.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
                return b" 200 " in s.recv(4096)
        except OSError:
            return False

    def memory_mib(self, field: str) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prober:
    """``GET /healthz`` every 10 ms on a kept-alive connection: (time sent, seconds)."""

    def __init__(self, port: int):
        self.port = port
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        sock = socket.create_connection(("127.0.0.1", self.port))
        while not self.stop.is_set():
            start = time.perf_counter()
            try:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                data = b""
                while not data.endswith(b"ok"):
                    chunk = sock.recv(4096)
                    if not chunk:
                        raise ConnectionError
                    data += chunk
            except OSError:  # closed while idle: open again (not counted)
                sock = socket.create_connection(("127.0.0.1", self.port))
                continue
            self.samples.append((start, time.perf_counter() - start))
            self.stop.wait(0.01)

    def between(self, t0: float, t1: float) -> list[float]:
        return [d for t, d in self.samples if t0 <= t < t1]

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


def send(port: int, tls_dir: str, path: str, body: bytes | Iterator[bytes]) -> str:
    """POST over mutual TLS; the answer's body (a declared length, or chunked)."""
    ctx = ssl.create_default_context(cafile=f"{tls_dir}/ca.crt")
    ctx.load_cert_chain(f"{tls_dir}/tls.crt", f"{tls_dir}/tls.key")
    with socket.create_connection(("127.0.0.1", port)) as raw, \
            ctx.wrap_socket(raw, server_hostname=SERVICE_NAME) as sock:
        head = f"POST {path} HTTP/1.1\r\nHost: {SERVICE_NAME}\r\nContent-Type: application/json\r\n"
        try:
            if isinstance(body, bytes):
                sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode())
                view = memoryview(body)
                for i in range(0, len(body), MIB):
                    sock.sendall(view[i:i + MIB])
            else:
                sock.sendall(f"{head}Transfer-Encoding: chunked\r\n\r\n".encode())
                for chunk in body:
                    sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sock.sendall(b"0\r\n\r\n")
        except OSError as exc:  # the server stopped reading: its answer may be waiting
            sent_error = f" (sending stopped: {exc})"
        else:
            sent_error = ""
        data = b""
        try:
            while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except OSError as exc:
            return f"no answer: {exc}{sent_error}"
    return data.split(b"\r\n\r\n", 1)[-1][:160].decode(errors="replace") + sent_error


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 1 << 30


def phases(names: list[str]) -> list[tuple[str, Callable[[int, str], list[str]]]]:
    victims = b",".join(b'{"UID":"%032x"}' % k for k in range(2_000_000))
    preempt = (b'{"Pod":{"metadata":{"name":"p","namespace":"x","uid":"u"}},'
               b'"NodeNameToMetaVictims":{"n00000":{"Pods":[' + victims +
               b'],"NumPDBViolations":0}}}')
    huge = b'{"Pod":{"metadata":{"name":"p"}},"NodeNames":[' + b'"n00000",' * (200 * MIB // 9)
    huge += b'"n00000"]}'
    pod = {"metadata": {"name": "big", "namespace": "bench", "uid": "big-uid",
                        "annotations": {"padding": "x" * (3 * MIB // 2)}},
           "spec": {"schedulerName": "gpupool-scheduler", "containers": [{
               "name": "main", "resources": {"limits": {"gpupool.io/gpu": "1"}}}]}}
    legit = msgspec.json.encode({"Pod": pod, "Nodes": None, "NodeNames": names})

    def chunks() -> Iterator[bytes]:
        part = b'"n00000",' * (MIB // 9)
        yield b'{"Pod":{"metadata":{"name":"p"}},"NodeNames":['
        for _ in range(256):
            yield part
        yield b'"n00000"]}'

    def many(path: str, body: bytes, count: int) -> Callable[[int, str], list[str]]:
        def run(port: int, tls_dir: str) -> list[str]:
            with ThreadPoolExecutor(count) as pool:
                return list(pool.map(lambda _: send(port, tls_dir, path, body), range(count)))
        return run

    return [
        (f"/preempt, 2,000,000 victims ({len(preempt) / MIB:.0f} MiB)",
         many("/preempt", preempt, 1)),
        (f"4 × /filter of {len(huge) / MIB:.0f} MiB at once", many("/filter", huge, 4)),
        ("/filter, 256 MiB chunked (no length announced)",
         lambda port, tls_dir: [send(port, tls_dir, "/filter", chunks())]),
        (f"4 × the largest legitimate /filter ({len(legit) / MIB:.1f} MiB: {len(names)} "
         "names, a 1.5 MiB pod)", many("/filter", legit, 4)),
    ]


def oversize(nodes: int, pods: int, seed: int) -> None:
    gpu_pods = pods * 3 // 5
    api = FakeApi(cluster_lines(nodes, gpu_pods, pods - gpu_pods, seed))
    folder = tempfile.TemporaryDirectory()
    ext = Extender(api.url)
    try:
        kube = KubeApi.connect(server=api.url)
        write_client_files(kube, folder.name)
        kube.close()
        names = [f"n{i:05d}" for i in range(nodes)]
        base_rss = ext.memory_mib("VmRSS")
        prober = Prober(ext.probes)
        time.sleep(2.0)
        idle = prober.between(0, time.perf_counter())
        print(f"\ngpupool extender over {nodes} nodes / {pods} pods: resident {base_rss:.0f} MiB "
              f"after the rebuild; /healthz every 10 ms")
        print(f"  {'idle (baseline)':58} /healthz ms p50/p99/max "
              f"{_ms(idle, 0.5)}/{_ms(idle, 0.99)}/{_ms(idle, 1.0)}")
        for title, run in phases(names):
            t0 = time.perf_counter()
            answers = run(ext.port, folder.name)
            t1 = time.perf_counter()
            during = prober.between(t0, t1)
            print(f"  {title:58} /healthz ms p50/p99/max {_ms(during, 0.5)}/"
                  f"{_ms(during, 0.99)}/{_ms(during, 1.0)} ({len(during)} probes); "
                  f"{t1 - t0:.1f} s; resident {ext.memory_mib('VmRSS'):.0f} MiB")
            for answer in sorted(set(answers)):
                print(f"      answer: {answer}")
        prober.close()
        peak = ext.memory_mib("VmHWM")
        print(f"  peak resident memory {peak:.0f} MiB = {peak / LIMIT_MIB:.0%} of the "
              f"Deployment's {LIMIT_MIB} MiB limit")
    finally:
        ext.stop()
        folder.cleanup()
        api.close()


def _ms(values: list[float], q: float) -> str:
    return f"{pct(values, q) * 1e3:.1f}" if values else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--no-https", action="store_true", help="skip HTTPS vs HTTP")
    parser.add_argument("--no-oversize", action="store_true", help="skip the oversized bodies")
    parser.add_argument("--oversize-nodes", type=int, default=5000)
    parser.add_argument("--oversize-pods", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    print(machine_line("before"))
    if not args.no_https:
        https_vs_http(args.nodes, args.pods, args.rounds, args.connections, args.seed)
    if not args.no_oversize:
        oversize(args.oversize_nodes, args.oversize_pods, args.seed)
    print("\n" + machine_line("after"))


if __name__ == "__main__":
    main()
