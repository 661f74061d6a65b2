"""The extender's HTTP face: a starlette app over an ``Extender``.

Routes: ``POST /filter``, ``/prioritize``, ``/bind``, ``/preempt`` (kube-scheduler
extender protocol), ``GET /healthz`` (the process answers), ``/readyz`` (the cache has
listed nodes, GPUs, pods and ledgers), ``/metrics`` (Prometheus text).

Every extender call answers HTTP 200: a body that is not JSON, or any failure
inside, comes back in ``Error`` (for prioritize, which has no error field, as
an empty list), because kube-scheduler shows an ``Error`` to the user verbatim
but turns an HTTP 500 into "code 500" and drops the body. Filter and
prioritize run on the event loop (CPU only, under the cache lock); bind, which
waits on the API server, runs in the thread pool.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from gpupool.core.errors import InvalidInput
from gpupool.extender import protocol
from gpupool.extender.service import Extender

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 256 * 1024 * 1024
Handler = Callable[[bytes], bytes]


def verb_handlers(extender: Extender) -> dict[str, Handler]:
    """Request body -> answer body for each extender verb; never raises (the HTTP face
    and the in-process benchmark both call these)."""
    def decoded(handler: Callable[[Any], Any], name: str) -> Handler:
        return lambda body: protocol.encode(handler(protocol.decode(body, name)))

    return {
        "filter": guarded("filter", extender.filter_json,
                          lambda m: protocol.encode(protocol.filter_error(m))),
        "prioritize": guarded("prioritize", extender.prioritize_json,
                              lambda _m: protocol.NO_PRIORITIES),
        "bind": guarded("bind", decoded(extender.bind, "bind"),
                        lambda m: protocol.encode(protocol.binding_result(m))),
        "preempt": guarded("preempt", decoded(extender.preempt, "preempt"),
                           lambda _m: protocol.encode(protocol.preemption_result({}, {}))),
    }


def guarded(name: str, handler: Handler, on_error: Callable[[str], bytes]) -> Handler:
    """``handler`` whose failures become ``on_error``'s answer (never a 500)."""
    def call(body: bytes) -> bytes:
        try:
            if len(body) > MAX_BODY_BYTES:
                raise InvalidInput(f"the {name} body is larger than {MAX_BODY_BYTES} bytes")
            return handler(body)
        except InvalidInput as exc:
            return on_error(str(exc))
        except Exception as exc:  # never a 500: the scheduler would drop the message
            log.exception("%s failed", name)
            return on_error(f"gpupool {name}: internal error: {type(exc).__name__}: {exc}")
    return call


def build_app(extender: Extender) -> Starlette:
    """The ASGI app serving ``extender``."""
    metrics = extender.metrics
    handlers = verb_handlers(extender)

    def verb(name: str, threaded: bool) -> Callable[[Request], Awaitable[Response]]:
        latency = metrics.latency.labels(name)
        handler = handlers[name]

        async def endpoint(request: Request) -> Response:
            start = time.perf_counter()
            body = await request.body()
            answer = await run_in_threadpool(handler, body) if threaded else handler(body)
            latency.observe(time.perf_counter() - start)
            return Response(answer, media_type="application/json")

        return endpoint

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(request: Request) -> Response:
        if extender.ready():
            return PlainTextResponse("ready")
        missing = sorted({"nodes", "devices", "pods", "ledgers"} - extender.cache.synced)
        return JSONResponse({"ready": False, "waiting for": missing}, status_code=503)

    async def prometheus(request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(routes=[
        Route("/filter", verb("filter", False), methods=["POST"]),
        Route("/prioritize", verb("prioritize", False), methods=["POST"]),
        Route("/bind", verb("bind", True), methods=["POST"]),
        Route("/preempt", verb("preempt", False), methods=["POST"]),
        Route("/healthz", healthz), Route("/readyz", readyz), Route("/metrics", prometheus),
    ])
