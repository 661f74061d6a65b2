"""Benchmark: does the extender's /healthz stay under 100 ms whatever its ports are sent?

    .venv/bin/python bench/bench_probes.py [--nodes 2000] [--pods 20000] [--repeat 3]
        [--connections 1000] [--probe-seconds 3]

``gpupool extender`` as its own process, as deployed (mutual TLS on the verbs' port, the
probes on another; ``--max-nodes 5000``, so the body limits are the shipped ones), over a
fake API server (a child process) holding ``--nodes`` nodes and ``--pods`` pods. A
prober opens a new connection for each ``GET /healthz``, as the kubelet does (its probes
keep no connection), every 10 ms, throughout. Phases:

* idle: the baseline;
* the largest body each verb accepts, sent ``--repeat`` times over kube-scheduler's
  mutual TLS: filter, prioritize, filter-claims and prioritize-claims (5,000 node names:
  the cluster's, then names of 253 characters; a pod padded to the limit), bind (its
  16 KiB limit),
  preempt as kube-scheduler fills it (a 2 MiB pod, 500 candidate nodes with 256 victims
  each) and preempt with 200,000 node keys (the shape that once stalled the extender
  about 1 s), both padded to the limit;
* ``--connections`` connections held open idle: to the verbs' port without a TLS
  handshake, to the verbs' port with kube-scheduler's certificate (handshake done, kept
  alive), and to the probe port.

Printed per phase: /healthz p50/p99/max in ms, the probes answered and failed, p99 over
the idle baseline's p99, and whether p99 is within the 100 ms target.
"""

from __future__ import annotations

import argparse
import socket
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import msgspec
from bench_extender import FakeApi, cluster_lines, pct
from bench_extender_tls import SERVICE_NAME, Extender, send, write_client_files

from gpupool.extender.edge.sizing import NAME_BYTES, BodyLimits
from gpupool.kube.api import KubeApi

from machine import line as machine_line

TARGET_MS = 100.0
LIMITS = BodyLimits.for_cluster(5000)
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


class Prober:
    """``GET /healthz`` on a new connection every 10 ms: (time sent, seconds or None)."""

    def __init__(self, port: int):
        self.port = port
        self.samples: list[tuple[float, float | None]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            start = time.perf_counter()
            self.samples.append((start, self._probe(start)))
            self.stop.wait(0.01)

    def _probe(self, start: float) -> float | None:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=10) as sock:
                sock.sendall(HEALTHZ)
                data = b""
                while not data.endswith(b"ok"):
                    chunk = sock.recv(4096)
                    if not chunk:
                        return None
                    data += chunk
            return time.perf_counter() - start if b" 200 " in data else None
        except OSError:
            return None

    def between(self, t0: float, t1: float) -> tuple[list[float], int]:
        """(latencies answered, probes failed) of the probes sent in [t0, t1)."""
        during = [d for t, d in self.samples if t0 <= t < t1]
        return [d for d in during if d is not None], sum(d is None for d in during)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(15)


def pod(pad_to: int) -> dict[str, object]:
    """A GPU pod whose annotation makes its JSON ``pad_to`` bytes."""
    obj: dict[str, object] = {
        "metadata": {"name": "big", "namespace": "bench", "uid": "big-uid",
                     "annotations": {"pad": ""}},
        "spec": {"schedulerName": "gpupool-scheduler", "containers": [{
            "name": "main", "resources": {"limits": {"gpupool.io/gpu": "1"}}}]}}
    bare = len(msgspec.json.encode(obj))
    obj["metadata"]["annotations"]["pad"] = "x" * (pad_to - bare)  # type: ignore[index]
    return obj


def exactly(build: Callable[[int], bytes], limit: int) -> bytes:
    """``build(pad)`` for the pad that makes it ``limit`` bytes."""
    pad = limit - len(build(0))
    body = build(pad)
    assert len(body) == limit, (len(body), limit)
    return body


def bodies(names: list[str]) -> list[tuple[str, str, bytes]]:
    """(title, path, body): the largest body of each verb."""
    long_names = names + [f"ghost-{k:05d}-{'x' * (NAME_BYTES - 16)}"  # 253 characters
                          for k in range(5000 - len(names))]

    def names_call(pad: int) -> bytes:
        return msgspec.json.encode({"Pod": pod(2 * 1024 * 1024 + pad),
                                    "NodeNames": long_names})
    names_body = exactly(names_call, LIMITS.filter_bytes)

    def bind_call(pad: int) -> bytes:
        return msgspec.json.encode({"PodName": "big", "PodNamespace": "bench",
                                    "PodUID": "big-uid", "Node": names[0], "Pad": "x" * pad})

    def victims_call(pad: int) -> bytes:
        victims = [{"UID": f"{k:036d}"} for k in range(256)]
        table = {f"{n}"[:200]: {"Pods": victims, "NumPDBViolations": 0}
                 for n in (names * (500 // len(names) + 1))[:500]}
        table.update({f"ghost-{k:03d}": {"Pods": victims, "NumPDBViolations": 0}
                      for k in range(500 - len(table))})
        return msgspec.json.encode({"Pod": pod(2 * 1024 * 1024 + pad),
                                    "NodeNameToMetaVictims": table})

    def node_keys_call(pad: int) -> bytes:
        table = {f"node-{k:06d}": {"Pods": [], "NumPDBViolations": 0} for k in range(200_000)}
        table[names[0]] = {"Pods": [{"UID": "v"}], "NumPDBViolations": 0}
        return msgspec.json.encode({"Pod": pod(4096 + pad), "NodeNameToMetaVictims": table})

    out = [(f"/{verb}, {len(names_body) / 2**20:.2f} MiB (its limit)", f"/{verb}", names_body)
           for verb in ("filter", "prioritize", "filter-claims", "prioritize-claims")]
    out.append((f"/bind, {LIMITS.bind_bytes // 1024} KiB (its limit)", "/bind",
                exactly(bind_call, LIMITS.bind_bytes)))
    out.append((f"/preempt, 500 nodes × 256 victims, {LIMITS.preempt_bytes / 2**20:.2f} MiB",
                "/preempt", exactly(victims_call, LIMITS.preempt_bytes)))
    out.append((f"/preempt, 200,000 node keys, {LIMITS.preempt_bytes / 2**20:.2f} MiB",
                "/preempt", exactly(node_keys_call, LIMITS.preempt_bytes)))
    return out


def held(port: int, count: int, tls_dir: str | None) -> list[socket.socket]:
    """``count`` idle connections to ``port`` (with kube-scheduler's certificate: each
    completes the handshake and one small call, then stays open)."""
    ctx = None
    if tls_dir is not None:
        ctx = ssl.create_default_context(cafile=f"{tls_dir}/ca.crt")
        ctx.load_cert_chain(f"{tls_dir}/tls.crt", f"{tls_dir}/tls.key")
    socks: list[socket.socket] = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        if ctx is not None:
            sock = ctx.wrap_socket(sock, server_hostname=SERVICE_NAME)
            sock.sendall(b"POST /bind HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            sock.recv(65536)
        socks.append(sock)
    return socks


def row(title: str, latencies: list[float], failed: int, base_p99: float | None) -> str:
    if not latencies:
        return f"  {title:58} no probe answered ({failed} failed)"
    p50, p99, top = (pct(latencies, q) * 1e3 for q in (0.5, 0.99, 1.0))
    ratio = f"{p99 / base_p99:5.1f}×" if base_p99 else "    -"
    verdict = "within" if p99 <= TARGET_MS and not failed else "OVER"
    return (f"  {title:58} {p50:6.1f} {p99:7.1f} {top:7.1f} {len(latencies):5d} {failed:4d} "
            f"{ratio}  {verdict} the {TARGET_MS:.0f} ms target")


def run(nodes: int, pods: int, repeat: int, connections: int, seconds: float,
        seed: int) -> None:
    gpu_pods = pods * 3 // 5
    api = FakeApi(cluster_lines(nodes, gpu_pods, pods - gpu_pods, seed))
    folder = tempfile.TemporaryDirectory()
    ext = Extender(api.url)
    prober = None
    try:
        kube = KubeApi.connect(server=api.url)
        write_client_files(kube, folder.name)
        kube.close()
        calls = bodies([f"n{i:05d}" for i in range(nodes)])
        prober = Prober(ext.probes)
        time.sleep(seconds)
        idle, idle_failed = prober.between(0, time.perf_counter())
        base = pct(idle, 0.99) * 1e3 if idle else None
        print(f"\ngpupool extender over {nodes} nodes / {pods} pods; /healthz on a new "
              "connection every 10 ms")
        print(f"  {'phase':58} {'p50':>6} {'p99':>7} {'max':>7} {'n':>5} {'fail':>4} "
              "p99/idle")
        print(row("idle (the baseline)", idle, idle_failed, base))
        for title, path, body in calls:
            t0 = time.perf_counter()
            answers = {send(ext.port, folder.name, path, body)[:70] for _ in range(repeat)}
            t1 = time.perf_counter()
            print(row(f"{title} ×{repeat}", *prober.between(t0, t1), base))
            for answer in sorted(answers):
                print(f"      answer ({(t1 - t0) / repeat:.2f} s each): {answer}")
        for title, port, tls in (
                (f"{connections} idle connections to the verbs' port, no TLS", ext.port, None),
                (f"{connections} idle kube-scheduler connections (TLS done)", ext.port,
                 folder.name),
                (f"{connections} idle connections to the probe port", ext.probes, None)):
            socks = held(port, connections, tls)
            t0 = time.perf_counter()
            time.sleep(seconds)
            print(row(title, *prober.between(t0, time.perf_counter()), base))
            for sock in socks:
                sock.close()
    finally:
        if prober is not None:
            prober.close()
        ext.stop()
        folder.cleanup()
        api.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--pods", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--probe-seconds", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    print(machine_line("before"))
    run(args.nodes, args.pods, args.repeat, args.connections, args.probe_seconds, args.seed)
    print("\n" + machine_line("after"))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
