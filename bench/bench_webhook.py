"""Benchmark of the admission webhook: what one AdmissionReview costs.

    .venv/bin/python bench/bench_webhook.py [--reviews 2000]

* **in process**: ``WebhookApp.decide`` (read the body, run the rule, write the answer)
  for a small GPU pod (mutate and validate) and for a large pod (20 GPU containers with
  30 variables each), per review, against the baseline of only decoding and encoding
  the same JSON (``json.loads`` + ``json.dumps``, the floor any webhook pays).
* **over HTTPS**: the same small GPU pod posted to ``/validate`` on a kept-alive TLS
  connection to the server on loopback, p50 / p99 round trip.

No target: the API server's timeout for these webhooks is 5 s; the figures say how far
below it a review is, and what a replica's CPU costs per pod created.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trustme

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "testing")]

from gpupool.webhook.admission import Settings, mutate, validate  # noqa: E402
from gpupool.webhook.metrics import Metrics  # noqa: E402
from gpupool.webhook.server import HttpsServer, WebhookApp  # noqa: E402
from gpupool.webhook.tls import ServingTls  # noqa: E402
from tests.webhook.builders import body, container, gpu_pod, pod, review  # noqa: E402


def per_review_us(fn: object, n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        fn()  # type: ignore[operator]
    return (time.perf_counter() - started) / n * 1e6


def in_process(n: int) -> None:
    app = WebhookApp(Settings(), Metrics(), lambda: True)
    large = pod("big", "team-a", *[container(f"c{i}", limits={"gpupool.io/gpu": "1"},
                                             env={f"V{j}": "x" for j in range(30)})
                                   for i in range(20)])
    cases = [("mutate, small GPU pod", mutate, body(review(gpu_pod()))),
             ("validate, small GPU pod", validate, body(review(gpu_pod()))),
             ("validate, 20 containers x 30 variables", validate, body(review(large)))]
    print(f"{'case':<42}{'bytes':>8}{'us/review':>11}{'json only':>11}{'ratio':>7}")
    for name, rule, raw in cases:
        cost = per_review_us(lambda rule=rule, raw=raw: app.decide("b", rule, raw), n)
        floor = per_review_us(lambda raw=raw: json.dumps(json.loads(raw)), n)
        print(f"{name:<42}{len(raw):>8}{cost:>11.0f}{floor:>11.0f}{cost / floor:>7.1f}")


def over_https(n: int) -> None:
    ca = trustme.CA()
    leaf = ca.issue_cert("gpupool-webhook.gpupool-system.svc")
    tls = ServingTls(Path(tempfile.mkdtemp(prefix="bench-webhook-")))
    tls.install(leaf.cert_chain_pems[0].bytes().decode(), leaf.private_key_pem.bytes().decode())
    server = HttpsServer(WebhookApp(Settings(), Metrics(), lambda: True).app, tls,
                         "127.0.0.1", 0)
    port = server.start()
    ctx = ssl.create_default_context(cadata=ca.cert_pem.bytes().decode())
    conn = http.client.HTTPConnection("gpupool-webhook.gpupool-system.svc", timeout=10)
    raw_sock = socket.create_connection(("127.0.0.1", port))
    raw_sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as Go's client does
    conn.sock = ctx.wrap_socket(raw_sock, server_hostname="gpupool-webhook.gpupool-system.svc")
    raw = body(review(gpu_pod()))
    times = []
    try:
        for _ in range(n):
            started = time.perf_counter()
            conn.request("POST", "/validate", raw, {"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            times.append((time.perf_counter() - started) * 1e3)
    finally:
        conn.close()
        server.stop()
    times.sort()
    print(f"HTTPS /validate, small GPU pod, kept-alive: p50 {statistics.median(times):.2f} ms, "
          f"p99 {times[int(len(times) * 0.99) - 1]:.2f} ms ({n} reviews)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reviews", type=int, default=2000)
    args = parser.parse_args()
    in_process(args.reviews)
    over_https(args.reviews)


if __name__ == "__main__":
    main()
