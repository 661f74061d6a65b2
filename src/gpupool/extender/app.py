"""The extender's HTTP face: an ASGI app over an ``Extender``.

Routes: ``POST /filter``, ``/prioritize``, ``/bind``, ``/preempt`` (kube-scheduler
extender protocol), ``GET /healthz`` (the process answers), ``/readyz`` (the cache has
listed nodes, GPUs, pods and ledgers), ``/metrics`` (Prometheus text).

Every extender call answers HTTP 200: a body that is not JSON, or any failure
inside, comes back in ``Error`` (for prioritize, which has no error field, as
an empty list), because kube-scheduler shows an ``Error`` to the user verbatim
but turns an HTTP 500 into "code 500" and drops the body. Filter and
prioritize run on the event loop (CPU only, under the cache lock); bind, which
waits on the API server, runs on the app's own thread pool.

The four verbs are served by a bare ASGI endpoint: it gathers the body chunks and
answers the handler's bytes, without starlette's request, routing and response
objects (about 0.05-0.1 ms of the ~0.25 ms a small call costs over loopback), and
hands bind to a ``ThreadPoolExecutor`` (a thread hop ~0.05 ms shorter than anyio's
``run_in_threadpool``); a verb called with another method gets 405. Everything else
(probes, metrics, unknown paths) goes to a starlette app.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from gpupool.core.errors import InvalidInput
from gpupool.extender import protocol
from gpupool.extender.metrics import Metrics
from gpupool.extender.service import Extender

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 256 * 1024 * 1024
BIND_THREADS = 16  # kube-scheduler binds asynchronously, up to its parallelism (16)
Handler = Callable[[bytes], bytes]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
JSON_HEADERS = [(b"content-type", b"application/json")]


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


class ExtenderApp:
    """ASGI: ``POST /filter|/prioritize|/bind|/preempt`` answered directly, the rest by
    ``fallback``."""

    def __init__(self, handlers: dict[str, Handler], metrics: Metrics, fallback: Starlette):
        self.fallback = fallback
        self.binds = ThreadPoolExecutor(BIND_THREADS, thread_name_prefix="extender-bind")
        self.verbs = {f"/{name}": (name, handler, metrics.latency.labels(name))
                      for name, handler in handlers.items()}

    def paths(self) -> set[str]:
        """Every path served: the verbs' and the fallback's."""
        return set(self.verbs) | {getattr(r, "path", "") for r in self.fallback.routes}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        verb = self.verbs.get(scope["path"]) if scope["type"] == "http" else None
        if verb is None:
            await self.fallback(scope, receive, send)
            return
        if scope["method"] != "POST":
            await send({"type": "http.response.start", "status": 405, "headers": [
                (b"allow", b"POST"), (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", b"18")]})
            await send({"type": "http.response.body", "body": b"Method Not Allowed"})
            return
        name, handler, latency = verb
        start = time.perf_counter()
        body = await read_body(receive)
        if body is None:  # the scheduler went away: nobody to answer
            return
        if name == "bind":  # waits on the API server: off the event loop
            answer = await asyncio.get_running_loop().run_in_executor(self.binds, handler, body)
        else:
            answer = handler(body)
        latency.observe(time.perf_counter() - start)
        await send({"type": "http.response.start", "status": 200, "headers": [
            *JSON_HEADERS, (b"content-length", b"%d" % len(answer))]})
        await send({"type": "http.response.body", "body": answer})


async def read_body(receive: Receive) -> bytes | None:
    """The request body (None if the client disconnected). Past ``MAX_BODY_BYTES`` the
    rest is drained unread: the handler's guard answers that the body is too large."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        if size <= MAX_BODY_BYTES:
            chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def build_app(extender: Extender) -> ExtenderApp:
    """The ASGI app serving ``extender``."""
    metrics = extender.metrics
    handlers = verb_handlers(extender)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(request: Request) -> Response:
        if extender.ready():
            return PlainTextResponse("ready")
        missing = sorted({"nodes", "devices", "pods", "ledgers"} - extender.cache.synced)
        return JSONResponse({"ready": False, "waiting for": missing}, status_code=503)

    async def prometheus(request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return ExtenderApp(handlers, metrics, Starlette(routes=[
        Route("/healthz", healthz), Route("/readyz", readyz), Route("/metrics", prometheus),
    ]))
