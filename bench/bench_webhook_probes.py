"""Benchmark: the webhook's /healthz and a review's latency while others load its port,
with the connection rules it serves under (``WEBHOOK_RULES``) and, in the same run, the
plain uvicorn it ran before (only a 30 s keep-alive timeout).

    .venv/bin/python bench/bench_webhook_probes.py [--connections 1000] [--seconds 3]

The webhook serves in a child process (HTTPS on loopback, its own certificate), as
deployed: the kubelet's probes, the API server's reviews and anyone else the network
lets in share its one port. A prober opens a new TLS connection for each
``GET /healthz`` every 10 ms (the kubelet keeps no probe connection); a reviewer posts a
small GPU pod to ``/validate`` on a kept-alive connection every 10 ms (as the API
server). Phases:

* idle: the baseline;
* ``--connections`` connections held idle by someone else (TLS handshake done, one
  request answered, then kept alive and silent);
* a max-size review: 8 MiB AdmissionReviews (``MAX_BODY_BYTES``) posted back to back on
  another connection.

Printed per variant and phase: /healthz p50/p99/max in ms and probes failed, the
review's p50/p99 in ms and reviews failed, and the connections the server closed of
those held. Target: /healthz p99 within 100 ms (the kubelet's probe timeout is 1 s by
default; the margin is for a busy node) and no probe or review failed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import socket
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trustme
import uvicorn

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "testing")]

from gpupool_testing.rawhttp import Dropped, exchange, read_answer  # noqa: E402

from gpupool.webhook.admission import Settings  # noqa: E402
from gpupool.webhook.metrics import Metrics  # noqa: E402
from gpupool.webhook.server import MAX_BODY_BYTES, HttpsServer, WebhookApp  # noqa: E402
from gpupool.webhook.tls import ServingTls  # noqa: E402
from tests.webhook.builders import body, gpu_pod, pod, review  # noqa: E402

from machine import line as machine_line  # noqa: E402

HOST = "gpupool-webhook.gpupool-system.svc"
TARGET_MS = 100.0
EVERY_S = 0.01


def before_config(server: HttpsServer) -> uvicorn.Config:
    """uvicorn as the webhook configured it before its connection rules."""
    return uvicorn.Config(server.app, log_level="warning", lifespan="off", access_log=False,
                          timeout_keep_alive=30, timeout_graceful_shutdown=5,
                          ssl_certfile=str(server.tls.cert_file),
                          ssl_keyfile=str(server.tls.key_file))


def serve(variant: str, cert: str, key: str, ports: Any, stop: Any) -> None:
    """The child: the webhook on an ephemeral port until ``stop``."""
    tls = ServingTls(Path(tempfile.mkdtemp(prefix="bench-webhook-probes-")))
    tls.install(cert, key)
    metrics = Metrics()
    server = HttpsServer(WebhookApp(Settings(), metrics, lambda: True).app, tls, "127.0.0.1",
                         0, closed=metrics.closed)
    if variant == "before":
        import gpupool.webhook.server as module
        module.uvicorn_config = lambda *_a, **_k: before_config(server)  # type: ignore
    ports.put(server.start())
    stop.wait()
    ports.put(json.dumps({s.labels["reason"]: s.value for m in metrics.closed.collect()
                          for s in m.samples if s.name.endswith("_total")}))
    server.stop()


class Client:
    def __init__(self, port: int, ca: str):
        self.port = port
        self.ctx = ssl.create_default_context(cadata=ca)

    def connect(self) -> ssl.SSLSocket:
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self.ctx.wrap_socket(raw, server_hostname=HOST)

    def healthz(self) -> bool:
        with self.connect() as sock:
            sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: {HOST}\r\nConnection: close"
                         "\r\n\r\n".encode())
            return read_answer(sock).status == 200


def timed_loop(call: Callable[[], bool], until: threading.Event,
               out: list[float | None]) -> None:
    """``call`` every ``EVERY_S`` until ``until``: its milliseconds, or None if it failed."""
    while not until.is_set():
        started = time.perf_counter()
        try:
            out.append((time.perf_counter() - started) * 1e3 if call() else None)
        except (OSError, Dropped):
            out.append(None)
        until.wait(EVERY_S)


def reviewer(client: Client) -> Callable[[], bool]:
    state: dict[str, ssl.SSLSocket] = {}
    raw = body(review(gpu_pod(), uid="r"))

    def call() -> bool:
        if "sock" not in state:
            state["sock"] = client.connect()
        try:
            answer = exchange(state["sock"], "POST", "/validate", raw, host=HOST)
        except (OSError, Dropped):
            state.pop("sock").close()  # the API server reconnects
            raise
        return answer.status == 200
    return call


def big_reviews(client: Client, until: threading.Event) -> None:
    obj = pod(annotations={"pad": ""})
    bare = len(body(review(obj, uid="big")))
    obj["metadata"]["annotations"]["pad"] = "x" * (MAX_BODY_BYTES - bare)
    raw = body(review(obj, uid="big"))
    with client.connect() as sock:
        while not until.is_set():
            assert exchange(sock, "POST", "/mutate", raw, host=HOST).status == 200


def hold(client: Client, count: int) -> list[ssl.SSLSocket]:
    socks = []
    for _ in range(count):
        sock = client.connect()
        sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
        read_answer(sock)
        socks.append(sock)
    return socks


def pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(len(values) * q))] if values else float("nan")


def phase(client: Client, seconds: float, load: Callable[[threading.Event], None] | None
          ) -> tuple[list[float | None], list[float | None]]:
    until = threading.Event()
    probes: list[float | None] = []
    reviews: list[float | None] = []
    threads = [threading.Thread(target=timed_loop, args=(client.healthz, until, probes)),
               threading.Thread(target=timed_loop, args=(reviewer(client), until, reviews))]
    if load is not None:
        threads.append(threading.Thread(target=load, args=(until,)))
    for t in threads:
        t.start()
    time.sleep(seconds)
    until.set()
    for t in threads:
        t.join(60)
    return probes, reviews


def summary(samples: list[float | None]) -> str:
    ok = sorted(s for s in samples if s is not None)
    failed = len(samples) - len(ok)
    return (f"{pct(ok, 0.5):>6.1f} {pct(ok, 0.99):>6.1f} {(ok[-1] if ok else 0):>6.1f}"
            f" {failed:>3}/{len(samples):<4}")


def run(variant: str, ca: trustme.CA, leaf: Any, args: argparse.Namespace) -> None:
    ctx = multiprocessing.get_context("spawn")
    ports, stop = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=serve, args=(variant, leaf.cert_chain_pems[0].bytes().decode(),
                                            leaf.private_key_pem.bytes().decode(), ports, stop))
    child.start()
    client = Client(ports.get(timeout=60), ca.cert_pem.bytes().decode())
    try:
        probes, reviews = phase(client, args.seconds, None)
        print(f"{variant:<7}{'idle':<26}{summary(probes)}  {summary(reviews)}")
        held = hold(client, args.connections)
        probes, reviews = phase(client, args.seconds, None)
        time.sleep(0.2)
        dropped = sum(1 for s in held if _closed(s))
        print(f"{variant:<7}{f'{args.connections} idle held':<26}{summary(probes)}  "
              f"{summary(reviews)}  closed {dropped}/{len(held)} held")
        for s in held:
            s.close()
        probes, reviews = phase(client, args.seconds, lambda until: big_reviews(client, until))
        print(f"{variant:<7}{'8 MiB reviews':<26}{summary(probes)}  {summary(reviews)}")
    finally:
        stop.set()
        print(f"{variant:<7}closed by the server, by reason: {ports.get(timeout=30)}")
        child.join(30)


def _closed(sock: ssl.SSLSocket) -> bool:
    sock.settimeout(0.001)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except (OSError, ssl.SSLError):
        return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    print(machine_line("before"))
    ca = trustme.CA()
    leaf = ca.issue_cert(HOST)
    print(f"{'':<7}{'phase':<26}{'/healthz ms: p50, p99, max, failed':<36}"
          f"{'review ms: p50, p99, max, failed'}")
    for variant in ("before", "after"):
        run(variant, ca, leaf, args)
    print(f"target: /healthz p99 <= {TARGET_MS:.0f} ms, nothing failed")
    print(machine_line("after"))


if __name__ == "__main__":
    main()
