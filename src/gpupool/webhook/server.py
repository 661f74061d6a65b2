"""The webhook's HTTPS endpoints (starlette under uvicorn).

* ``POST /mutate``, ``POST /validate``: AdmissionReview v1 in, AdmissionReview v1 out
  (HTTP 200 with ``allowed`` and the message). A body that is no AdmissionReview v1
  request is answered with HTTP 400 and ``{"error": ...}`` when it has no readable
  ``request.uid``, else with a denial naming the problem; a body above ``MAX_BODY_BYTES``
  gets 413. A rule that fails unexpectedly denies (fail closed) and is logged; the
  server never stops answering.
* ``GET /healthz``: the process answers; ``GET /readyz``: a certificate is served.

Rules run on a worker thread, so one large body never holds up the others.

The port is reachable by the API server, the kubelet's probes and anyone else the
network lets in, so its connections follow ``WEBHOOK_RULES`` (``gpupool.http``, the edge
the extender's port uses too): a request head over ``HEADER_BYTES`` closes the
connection, whatever the chunking (a body's bytes never count as head bytes); a request
not whole ``READ_S`` after its first byte (a slow head or a slow body) closes it; a
connection silent ``IDLE_S`` after its last answer is closed; and at most
``MAX_CONNECTIONS`` are held: past that, the one quiet longest and not being answered is
closed to make room, so connections others hold idle never keep the API server's review
or the kubelet's probe out. A TLS handshake not done ``HANDSHAKE_S`` after the
connection was accepted closes it, and at most ``MAX_HANDSHAKES`` are in progress (past
that the oldest is closed). Each close is counted in
``gpupool_webhook_connections_closed_total{reason}``. The bodies held at once over all
connections are bounded (``BODY_BUDGET_BYTES``, the extender's budget from
``gpupool.http.budget``): a review whose body would pass it is answered 429 with
Retry-After unread. The sizes are ``sizes.Sizes``, the command's flags.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn
from prometheus_client import Counter
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from gpupool.http.budget import BodyBudget
from gpupool.http.serving import uvicorn_config
from gpupool.webhook.admission import Settings, mutate, validate
from gpupool.webhook.metrics import Metrics
from gpupool.webhook.review import BadReview, Request, Verdict, answer, read_review, uid_of
from gpupool.webhook.sizes import GRACEFUL_S, MAX_BODY_BYTES, RETRY_AFTER_S, Sizes
from gpupool.webhook.tls import ServingTls

log = logging.getLogger(__name__)

Rule = Callable[[Request, Settings], Verdict]
DEFAULT_SIZES = Sizes()
WEBHOOK_RULES = DEFAULT_SIZES.rules()
__all__ = ["MAX_BODY_BYTES", "WEBHOOK_RULES", "HttpsServer", "Sizes", "WebhookApp"]


class TooLarge(Exception):
    pass


class OverBudget(Exception):
    pass


class _Held:
    """The bytes of one body taken from the budget so far: as they arrive, never what a
    head declares (a head alone, declaring the largest body, would hold its share for the
    whole request deadline)."""

    def __init__(self, budget: BodyBudget):
        self.budget = budget
        self.bytes = 0

    def take(self, size: int) -> None:
        if not self.budget.reserve(size):
            raise OverBudget
        self.bytes += size

    def release(self) -> None:
        self.budget.release(self.bytes)
        self.bytes = 0


async def _body(request: HttpRequest, limit: int, held: _Held) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge
        held.take(len(chunk))
        chunks.append(chunk)
    return b"".join(chunks)


def _declared(request: HttpRequest) -> int | None:
    declared = request.headers.get("content-length", "")
    return int(declared) if declared.isdigit() else None


class WebhookApp:
    """The starlette app of one webhook process."""

    def __init__(self, settings: Settings, metrics: Metrics, ready: Callable[[], bool],
                 sizes: Sizes = DEFAULT_SIZES):
        self.settings = settings
        self.sizes = sizes
        self.budget = BodyBudget(sizes.body_budget_bytes)
        self.metrics = metrics
        self.ready = ready
        self.app = Starlette(routes=[
            Route("/mutate", self._endpoint("mutate", mutate), methods=["POST"]),
            Route("/validate", self._endpoint("validate", validate), methods=["POST"]),
            Route("/healthz", self._healthz, methods=["GET"]),
            Route("/readyz", self._readyz, methods=["GET"]),
        ])

    def _endpoint(self, name: str, rule: Rule) -> Callable[[HttpRequest], Any]:
        limit = self.sizes.max_body_bytes
        too_large = {"error": f"the body is larger than {limit} bytes"}

        async def handle(request: HttpRequest) -> Response:
            declared = _declared(request)
            if declared is not None and declared > limit:
                self.metrics.bad.labels(name).inc()
                return JSONResponse(too_large, 413)
            if declared is not None and declared > self.budget.cap_bytes - self.budget.reading:
                return self._busy(name, declared)  # cannot fit now: refused unread
            held = _Held(self.budget)
            try:  # released however the read ends: a client gone mid-body included
                try:
                    body = await _body(request, limit, held)
                except TooLarge:
                    self.metrics.bad.labels(name).inc()
                    return JSONResponse(too_large, 413)
                except OverBudget:
                    return self._busy(name, declared if declared is not None else limit)
                code, out = await run_in_threadpool(self.decide, name, rule, body)
            finally:
                held.release()
            return Response(json.dumps(out, separators=(",", ":")), code,
                            media_type="application/json")
        return handle

    def _busy(self, endpoint: str, size: int) -> Response:
        """429 for a body that would take the bodies held past the budget (unread)."""
        self.metrics.over_budget.labels(endpoint).inc()
        log.warning("%s: refused a body of %d bytes: %d bytes of other reviews are held, "
                    "the budget is %d", endpoint, size, self.budget.reading,
                    self.budget.cap_bytes)
        return JSONResponse({"error": f"gpupool webhook: {self.budget.reading} bytes of other "
                                      "reviews are being read; this one would pass the "
                                      f"{self.budget.cap_bytes}-byte budget, try again"},
                            429, headers={"Retry-After": str(RETRY_AFTER_S)})

    def decide(self, endpoint: str, rule: Rule, body: bytes) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body) for one review; never raises."""
        started = time.perf_counter()
        try:
            request = read_review(body)
        except BadReview as exc:
            self.metrics.bad.labels(endpoint).inc()
            uid = uid_of(body)
            log.warning("%s: refused a body that is no AdmissionReview v1: %s", endpoint, exc)
            if not uid:
                return 400, {"error": f"gpupool webhook: {exc}"}
            return 200, answer(uid, Verdict.deny(f"gpupool webhook: {exc}", 400, "BadRequest"))
        verdict = self._judge(endpoint, rule, request)
        self.metrics.latency.labels(endpoint).observe(time.perf_counter() - started)
        self.metrics.reviewed(endpoint, request.what, request.operation, verdict.outcome)
        _log(endpoint, request, verdict)
        return 200, answer(request.uid, verdict)

    def _judge(self, endpoint: str, rule: Rule, request: Request) -> Verdict:
        try:
            return rule(request, self.settings)
        except Exception:  # a bug in a rule: deny (fail closed), keep serving
            log.exception("%s: a rule failed on %s %s %s/%s", endpoint, request.operation,
                          request.what, request.namespace, request.name)
            self.metrics.errors.labels(endpoint).inc()
            return Verdict.deny("gpupool webhook: internal error while judging this request "
                                "(see the webhook's log)", 500, "InternalError")

    async def _healthz(self, _: HttpRequest) -> Response:
        return PlainTextResponse("ok")

    async def _readyz(self, _: HttpRequest) -> Response:
        if self.ready():
            return PlainTextResponse("ok")
        return PlainTextResponse("no serving certificate yet", 503)


def _log(endpoint: str, request: Request, verdict: Verdict) -> None:
    where = f"{request.operation} {request.what} {request.namespace}/{request.name}".rstrip("/")
    if not verdict.allowed:
        log.info("%s: denied %s by %s: %s", endpoint, where, request.username, verdict.message)
    elif verdict.patch:
        paths = ", ".join(str(op["path"]) for op in verdict.patch)
        log.info("%s: patched %s: %s", endpoint, where, paths)
    else:
        log.debug("%s: allowed %s by %s", endpoint, where, request.username)
    for warning in verdict.warnings:
        log.info("%s: warned %s: %s", endpoint, where, warning)


class HttpsServer:
    """uvicorn serving ``app`` over TLS on a thread; the certificate follows ``tls``;
    connections follow ``rules`` (closes counted in ``closed``, by reason)."""

    def __init__(self, app: Any, tls: ServingTls, host: str = "0.0.0.0", port: int = 8443, *,
                 sizes: Sizes = DEFAULT_SIZES, closed: Counter | None = None):
        self.app, self.tls, self.host, self.port = app, tls, host, port
        self.rules = sizes.rules()
        self.closed = closed if closed is not None else _orphan_counter()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> int:
        """Serve (the first certificate must be installed); returns the port."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn_config(self.app, self.closed, self.rules, graceful_s=GRACEFUL_S,
                                ssl_certfile=str(self.tls.cert_file),
                                ssl_keyfile=str(self.tls.key_file))
        config.load()
        assert config.ssl is not None
        self.tls.attach(config.ssl)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        daemon=True, name="webhook-https")
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the webhook server did not start")
            threading.Event().wait(0.01)
        return self.port

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)


def _orphan_counter() -> Counter:
    """A counter in no registry, for servers whose caller keeps no metrics."""
    return Counter("gpupool_webhook_connections_closed_total", "closed connections",
                   ["reason"], registry=None)
