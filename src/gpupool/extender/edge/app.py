"""The extender's HTTP face: an ASGI app over an ``Extender``.

Routes: ``POST /filter``, ``/prioritize``, ``/bind``, ``/preempt`` (kube-scheduler
extender protocol), and on the probe app ``GET /healthz`` (the process answers),
``/readyz`` (the cache has listed nodes, GPUs, pods and ledgers), ``/metrics``
(Prometheus text). ``gpupool extender`` serves the verbs on the mutual-TLS port and the
probes on a separate plain port (``build_verbs`` and ``build_probes``); ``build_app``
puts both on one app (tests, and ``--plain-http`` experiments).

Every extender call answers HTTP 200: a body that is not JSON, too large a body, or any
failure inside, comes back in ``Error`` (for prioritize and preempt, which have no error
field, as an empty answer, and the reason is logged), because kube-scheduler shows an
``Error`` to the user verbatim but turns an HTTP 500 into "code 500" and drops the body.

Bounded work per request:

* a body larger than its verb's limit (``sizing.BodyLimits``) is answered at once with
  an ``Error`` naming the limit, and never buffered: the server reads the rest and
  throws it away; so is a body that would take the bodies being read at once past
  ``budget_bytes``;
* a body is read into one buffer of its declared length (no chunk list, no join copy);
* a body nested more than ``jsondepth.MAX_DEPTH`` levels deep is refused before it is
  decoded (the decoders recurse per level; the answer must not depend on the
  interpreter's recursion limit); so is a preempt body naming more candidate nodes than
  the cluster has (``proposals.too_many_nodes``);
* decoding and deciding run off the event loop, on the app's own thread pools (two
  threads decide, sixteen bind: kube-scheduler binds asynchronously, up to its
  parallelism), so the event loop keeps reading other calls while one is decided —
  except filter and prioritize bodies of at most ``INLINE_BYTES`` (256 KiB: a pod and
  about 5,000 node names), whose work is bounded by their size (a few ms at 5,000
  nodes) and smaller than the hop to a thread and back costs (0.5 ms of CPU per pod
  over HTTP, measured: docs/benchmarks.md). The probes have a loop of their own;
* slow and idle connections are closed by the server's protocol
  (``connections.guarded_protocol``).

The four verbs are served by a bare ASGI endpoint: it reads the body and answers the
handler's bytes, without starlette's request, routing and response objects (about
0.05-0.1 ms of the ~0.25 ms a small call costs over loopback); a verb called with another
method gets 405. Everything else goes to ``fallback`` (the probes, or 404).
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

from gpupool.contract import jsondepth
from gpupool.core.errors import InvalidInput
from gpupool.extender.dra.drafilter import claims_filter_json
from gpupool.extender.dra.drascores import claims_priorities_json
from gpupool.extender.edge.sizing import BodyLimits
from gpupool.extender.metrics import Metrics
from gpupool.extender.preemption import proposals
from gpupool.extender.service import READY_KINDS, Extender
from gpupool.extender.wire import protocol
from gpupool.http.budget import BodyBudget

log = logging.getLogger(__name__)
BIND_THREADS = 16  # kube-scheduler binds asynchronously, up to its parallelism (16)
DECIDE_THREADS = 2
INLINE_BYTES = 256 * 1024  # filter and prioritize bodies up to this size: on the loop
INLINE_VERBS = frozenset({"filter", "prioritize", "prioritize-claims", "filter-claims"})
Body = bytes | bytearray
Handler = Callable[[Body], bytes]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
JSON_HEADERS = [(b"content-type", b"application/json")]

REFUSED: dict[str, Callable[[str], bytes]] = {
    "filter": lambda m: protocol.encode(protocol.filter_error(m)),
    "prioritize": lambda _m: protocol.NO_PRIORITIES,
    "prioritize-claims": lambda _m: protocol.NO_PRIORITIES,  # DRA pods (docs/dra.md)
    "filter-claims": lambda m: protocol.encode(protocol.filter_error(m)),  # DRA pods' tenancy
    "bind": lambda m: protocol.encode(protocol.binding_result(m)),
    "preempt": lambda _m: protocol.encode(protocol.preemption_result({}, {})),
}
"""Each verb's answer to a refused call (the message, where the verb has an ``Error``)."""


def verb_handlers(extender: Extender) -> dict[str, Handler]:
    """Request body -> answer body for each extender verb; never raises (the HTTP face
    and the in-process benchmark both call these)."""
    def decoded(handler: Callable[[Any], Any], name: str) -> Handler:
        return lambda body: protocol.encode(handler(protocol.decode(body, name)))

    return {
        "filter": guarded("filter", extender.filter_json),
        "prioritize": guarded("prioritize", extender.prioritize_json),
        "prioritize-claims": guarded("prioritize-claims",
                                     lambda body: claims_priorities_json(extender, body)),
        "filter-claims": guarded("filter-claims",
                                 lambda body: claims_filter_json(extender, body)),
        "bind": guarded("bind", decoded(extender.bind, "bind")),
        "preempt": guarded("preempt", lambda body: protocol.encode(extender.preempt(body))),
    }


def guarded(name: str, handler: Callable[[Any], bytes]) -> Handler:
    """``handler`` whose failures become the verb's refusal (never a 500)."""
    refuse = REFUSED[name]

    def call(body: Body) -> bytes:
        try:
            return handler(body)
        except InvalidInput as exc:
            return refuse(str(exc))
        except Exception as exc:  # never a 500: the scheduler would drop the message
            log.exception("%s failed", name)
            return refuse(f"gpupool {name}: internal error: {type(exc).__name__}: {exc}")
    return call


class ExtenderApp:
    """ASGI: ``POST /filter|/prioritize|/bind|/preempt`` answered directly, the rest by
    ``fallback``."""

    def __init__(self, handlers: dict[str, Handler], metrics: Metrics, fallback: Any,
                 limits: BodyLimits | None = None):
        self.fallback = fallback
        self.limits = limits or BodyLimits.for_cluster()
        self.binds = ThreadPoolExecutor(BIND_THREADS, thread_name_prefix="extender-bind")
        self.decide = ThreadPoolExecutor(DECIDE_THREADS, thread_name_prefix="extender-decide")
        self.metrics = metrics
        self.inline_bytes = INLINE_BYTES
        self.refused = metrics.refused_bodies
        self.budget = BodyBudget(self.limits.budget_bytes)  # bodies being read or decided
        self.verbs = {f"/{name}": (name, handler, metrics.latency.labels(name))
                      for name, handler in handlers.items()}

    @property
    def reading(self) -> int:
        """Bytes of the bodies being read or decided now."""
        return self.budget.reading

    @reading.setter
    def reading(self, size: int) -> None:
        self.budget.reading = size

    def paths(self) -> set[str]:
        """Every path served: the verbs' and the fallback's."""
        return set(self.verbs) | {getattr(r, "path", "") for r in
                                  getattr(self.fallback, "routes", ())}

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
        size = _declared_length(scope)
        reserved = self._reserve(name, size)
        try:
            answer = await self._answer(name, handler, receive, size, reserved)
        finally:
            self.budget.release(reserved if isinstance(reserved, int) else 0)
        if answer is None:  # the scheduler went away: nobody to answer
            return
        latency.observe(time.perf_counter() - start)
        await send({"type": "http.response.start", "status": 200, "headers": [
            *JSON_HEADERS, (b"content-length", b"%d" % len(answer))]})
        await send({"type": "http.response.body", "body": answer})

    def _reserve(self, name: str, size: int | None) -> int | str:
        """Bytes reserved for the body (the declared length, else the verb's limit), or why
        the body is refused unread."""
        limit = self.limits.of(name)
        if size is not None and size > limit:
            return (f"gpupool {name}: the request body is {size} bytes, more than the {limit} "
                    "this extender accepts (sized by --max-nodes and --node-cache-capable)")
        want = size if size is not None else limit
        if not self.budget.reserve(want):
            return (f"gpupool {name}: {self.budget.reading} bytes of other requests are being "
                    "read; this one would pass the extender's budget, try again")
        return want

    async def _answer(self, name: str, handler: Handler, receive: Receive, size: int | None,
                      reserved: int | str) -> bytes | None:
        if isinstance(reserved, str):
            return self._refuse(name, reserved)
        body = await read_body(receive, size, self.limits.of(name))
        if body is None:
            return None
        if isinstance(body, str):
            return self._refuse(name, f"gpupool {name}: {body}")
        if jsondepth.deeper_than(body):  # before any decoder recurses into it
            return self._refuse(name, f"gpupool {name}: the request body is JSON nested more "
                                      f"than {jsondepth.MAX_DEPTH} levels deep (no Kubernetes "
                                      "object comes near)")
        crowded = proposals.too_many_nodes(body, self.limits.nodes) if name == "preempt" else ""
        if crowded:
            return self._refuse(name, f"gpupool {name}: {crowded}")
        if name in INLINE_VERBS and len(body) <= self.inline_bytes:
            return handler(body)  # a small filter: less work than the thread hop costs
        pool = self.binds if name == "bind" else self.decide
        return await asyncio.get_running_loop().run_in_executor(pool, handler, body)

    def _refuse(self, name: str, why: str) -> bytes:
        """The refusal, answered at once: the server reads the rest of the body and throws
        it away (HTTP/1.1 lets a server answer before the request ends; kube-scheduler's
        Go client reads such an early answer)."""
        self.refused.labels(name).inc()
        log.warning("%s refused: %s", name, why)
        return REFUSED[name](why)


def _declared_length(scope: Scope) -> int | None:
    for key, value in scope.get("headers", ()):
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def read_body(receive: Receive, size: int | None, limit: int) -> Body | str | None:
    """The request body: into one buffer of the declared ``size``, else gathered up to
    ``limit`` (past it, reading stops and the answer is why). None if the client
    disconnected."""
    buf = bytearray(size) if size is not None else None
    cap = size if size is not None else limit
    chunks: list[bytes] = []
    got = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        if got + len(chunk) > cap:
            return f"the request body is larger than the {limit} bytes this extender accepts"
        if buf is not None:
            buf[got:got + len(chunk)] = chunk
        else:
            chunks.append(chunk)
        got += len(chunk)
        if not message.get("more_body", False):
            break
    if buf is not None:
        return buf if got == len(buf) else buf[:got]
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def build_probes(extender: Extender, serving: Callable[[], bool] = lambda: True) -> Starlette:
    """``/healthz``, ``/readyz`` and ``/metrics``. ``serving``: whether the verbs' server
    is listening yet (ready only then: the Service must not send kube-scheduler to a
    replica whose verb port is still closed)."""
    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(request: Request) -> Response:
        if extender.ready() and serving():
            return PlainTextResponse("ready")
        missing = sorted(READY_KINDS - extender.cache.synced)
        if not serving():
            missing.append("the verbs' server to listen")
        return JSONResponse({"ready": False, "waiting for": missing}, status_code=503)

    async def prometheus(request: Request) -> Response:
        return Response(generate_latest(extender.metrics.registry),
                        media_type=CONTENT_TYPE_LATEST)

    return Starlette(routes=[Route("/healthz", healthz), Route("/readyz", readyz),
                             Route("/metrics", prometheus)])


def build_verbs(extender: Extender, limits: BodyLimits | None = None) -> ExtenderApp:
    """The four verbs alone (anything else: 404)."""
    return ExtenderApp(verb_handlers(extender), extender.metrics, Starlette(), limits)


def build_app(extender: Extender, limits: BodyLimits | None = None) -> ExtenderApp:
    """The verbs and the probes on one app."""
    return ExtenderApp(verb_handlers(extender), extender.metrics, build_probes(extender),
                       limits)
