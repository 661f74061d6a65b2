"""A FAKE Kubernetes API server: the one test seam in front of the real API.

It implements, in memory, just the REST subset gpupool uses, and serves it as a
real HTTP app (starlette under uvicorn, in a thread, on 127.0.0.1) so tests
drive the real ``lightkube`` client over real HTTP. It is a fake: no auth (unless
bearer tokens are required with ``require_token``), no
admission, no validation beyond what gpupool relies on.

Resources (``KINDS``): ``pods`` (namespaced, subresources ``binding`` and
``status``), ``nodes``, and the gpupool CRDs ``gpudevices``,
``resourceclasses``, ``resourcegroups``, ``gpuledgers`` (cluster-scoped, with a
``status`` subresource), and the rest of ``KINDS`` (``leases`` of coordination.k8s.io
among them: leader election).

REST behaviour:

* ``GET`` collection: ``labelSelector`` (``k=v``, ``k==v``, ``k!=v``, ``k``,
  ``!k``, ``k in (a,b)``, ``k notin (a,b)``) and ``fieldSelector`` (``path=v``,
  ``path!=v`` on dotted paths, e.g. ``spec.nodeName=n1``); the list carries
  ``metadata.resourceVersion``.
* ``GET ...?watch=true&resourceVersion=R&timeoutSeconds=T``: newline-delimited
  ``{"type": ADDED|MODIFIED|DELETED, "object": ...}`` events after ``R``
  (without ``R``: synthetic ADDED for every current object first); a ``R``
  older than the retained history gets an ``ERROR`` event with a 410 Status.
* ``POST`` create (409 AlreadyExists), ``GET``/``DELETE`` one object (404),
  ``PUT`` replace and ``PATCH`` (JSON merge patch; strategic merge is treated
  as merge patch): a ``metadata.resourceVersion`` in the body that is not the
  current one answers 409 Conflict and changes nothing.
* ``POST pods/{name}/eviction``: deletes the pod (the fake keeps no PodDisruptionBudgets;
  ``fail_next("POST", "eviction", 429, ...)`` answers as a budget that allows no
  disruption does).
* ``POST pods/{name}/binding``: sets ``spec.nodeName`` and merges the Binding's
  ``metadata.annotations`` into the pod, as the real API server does; 409 if
  the pod is already bound or the Binding's ``metadata.uid`` is not the pod's.
* ``.../status``: ``GET``/``PUT``/``PATCH`` touch only ``status``.
* Errors are ``Status`` objects with ``Content-Type: application/json``.
* Cheap in CPU (uvicorn's C stack, msgspec copies, each event line rendered
  once for all watchers, only the watches of the written kind woken): in a
  benchmark it shares the machine's cores with the extender, where a real API
  server would run elsewhere.
* Latency, when asked (``latency_s=(low, high)``, ``--latency-ms LOW HIGH``): every
  request but a watch waits a seeded uniform draw in that range before it is served,
  as a real API server answers after etcd commits (a write is seen by watches only
  then). Event-loop timers round to the millisecond, so figures under 1 ms mean little.

Python handle (thread-safe, for tests)::

    with FakeApiServer() as api:          # or api.start() / api.stop()
        api.url                           # "http://127.0.0.1:<port>"
        api.seed("nodes", node_dict)      # create (or replace) an object, returns it
        api.get("pods", "p1", "default")  # a deep copy, or None
        api.objects("gpudevices")         # deep copies of all objects of a kind
        api.patch("pods", "p1", {...}, "default")   # merge patch, bumps resourceVersion
        api.delete("pods", "p1", "default")
        api.fail_next("POST", "binding", 500, "boom")   # inject one failure
        api.require_token("t1", "t2")     # 401 to requests without one of these bearer tokens
        api.requests                      # [(method, path), ...] seen so far
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import threading
import uuid
from collections.abc import AsyncIterator

import msgspec
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from gpupool_testing.fake_store import (  # re-exported for tests that seed or patch
    HISTORY,
    KINDS,
    ApiFailure,
    Kind,
    Listener,
    Obj,
    Store,
    event_line,
    merge_patch,
    status_body,
)

__all__ = ["HISTORY", "KINDS", "ApiFailure", "FakeApiServer", "Kind", "Obj", "Store", "load_seed",
           "merge_patch", "status_body"]


# -- the HTTP app -----------------------------------------------------------------------------
class _PromptServer(uvicorn.Server):
    """uvicorn's server, stopped as soon as ``wake`` is called. uvicorn itself looks at
    ``should_exit`` every 0.1 s, then gives open connections 0.1 s and more to finish:
    about 0.2 s a stop, and most tests start and stop a fake of their own. A fake has
    nothing to finish: its connections are closed at once."""

    _loop: asyncio.AbstractEventLoop | None = None
    _woken: asyncio.Event | None = None

    async def main_loop(self) -> None:
        self._woken = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        while not self.should_exit and not await self.on_tick(0):  # tick 0: update the Date
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._woken.wait(), 1.0)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()  # closes an idle one, ends a kept-alive one after its answer
        await asyncio.sleep(0)  # lets them write what they have
        for connection in list(self.server_state.connections):
            connection.transport.close()

    def wake(self) -> None:
        """Stop serving now (from any thread)."""
        self.should_exit = self.force_exit = True
        loop, woken = self._loop, self._woken
        if loop is not None and woken is not None:
            with contextlib.suppress(RuntimeError):  # the loop has ended already
                loop.call_soon_threadsafe(woken.set)


class FakeApiServer:
    """The fake API server: an in-memory ``Store`` behind a Kubernetes-shaped REST app."""

    def __init__(self, latency_s: tuple[float, float] = (0.0, 0.0), seed: int = 0) -> None:
        self.store = Store()
        self.latency_s = latency_s
        self._delays = random.Random(seed)
        self.requests: list[tuple[str, str]] = []
        self._failures: list[tuple[str, str, int, str]] = []
        self._tokens: frozenset[str] = frozenset()  # empty: no authentication (the default)
        self.unauthorized = 0  # requests answered 401
        self._server: _PromptServer | None = None
        self._thread: threading.Thread | None = None
        self._closing = False
        self.url = ""
        self.app = self._build_app()

    # -- Python handle --------------------------------------------------------------------------
    def seed(self, plural: str, obj: Obj) -> Obj:
        meta = obj.get("metadata", {})
        kind = KINDS[plural]
        ns = meta.get("namespace", "default") if kind.namespaced else None
        with contextlib.suppress(ApiFailure):
            self.store.delete(plural, meta.get("name", ""), ns)
        return self.store.create(plural, obj, ns)

    def get(self, plural: str, name: str, namespace: str | None = None) -> Obj | None:
        try:
            return self.store.get(plural, name, namespace)
        except ApiFailure:
            return None

    def objects(self, plural: str) -> list[Obj]:
        return self.store.select(plural, None, "", "")[0]

    def patch(self, plural: str, name: str, patch: Obj, namespace: str | None = None) -> Obj:
        return self.store.update(plural, name, namespace, patch)

    def patch_status(self, plural: str, name: str, status: Obj,
                     namespace: str | None = None) -> Obj:
        return self.store.update(plural, name, namespace, {"status": status},
                                 subresource="status")

    def delete(self, plural: str, name: str, namespace: str | None = None) -> None:
        self.store.delete(plural, name, namespace)

    def fail_next(self, method: str, path_part: str, code: int, message: str = "injected") -> None:
        """The next ``method`` request whose path contains ``path_part`` answers ``code``."""
        with self.store.lock:
            self._failures.append((method.upper(), path_part, code, message))

    def forget_failures(self, path_part: str) -> None:
        """Drop the failures ``fail_next`` queued for ``path_part`` that are not answered yet
        (a fault that ends when the test says so, not after a count of requests)."""
        with self.store.lock:
            self._failures = [f for f in self._failures if f[1] != path_part]

    def require_token(self, *tokens: str) -> None:
        """From now on answer 401 Unauthorized to requests that do not carry
        ``Authorization: Bearer <one of tokens>`` (no tokens: accept every request again);
        a token the server stops accepting is how an expired service account token fails."""
        with self.store.lock:
            self._tokens = frozenset(tokens)

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> str:
        # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets that say so
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        # uvicorn's C stack: in a benchmark the fake shares the machine's cores with the
        # extender, so it should cost as little CPU as it can
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off",
                                timeout_graceful_shutdown=1, access_log=False, http="httptools",
                                loop="uvloop")
        self._server = _PromptServer(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name="fake-apiserver", daemon=True)
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the fake API server did not start")
            threading.Event().wait(0.01)
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    def stop(self) -> None:
        self._closing = True
        with self.store.lock:
            for listener in self.store.listeners:
                listener.loop.call_soon_threadsafe(listener.event.set)
        if self._server is not None:
            self._server.wake()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> FakeApiServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- routing -------------------------------------------------------------------------------
    def _build_app(self) -> Starlette:
        methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
        core = "/api/v1"
        crd = "/apis/{group}/{version}"
        routes = [  # namespaced objects of API groups first (else "namespaces" reads as a plural)
            Route(crd + "/namespaces/{namespace}/{plural}/{name}/{sub}", self._handle,
                  methods=methods),
            Route(crd + "/namespaces/{namespace}/{plural}/{name}", self._handle, methods=methods),
            Route(crd + "/namespaces/{namespace}/{plural}", self._handle, methods=methods),
            Route(core + "/namespaces/{namespace}/{plural}/{name}/{sub}", self._handle,
                  methods=methods),
            Route(core + "/namespaces/{namespace}/{plural}/{name}", self._handle, methods=methods),
            Route(core + "/namespaces/{namespace}/{plural}", self._handle, methods=methods),
            Route(core + "/{plural}/{name}/{sub}", self._handle, methods=methods),
            Route(core + "/{plural}/{name}", self._handle, methods=methods),
            Route(core + "/{plural}", self._handle, methods=methods),
            Route(crd + "/{plural}/{name}/{sub}", self._handle, methods=methods),
            Route(crd + "/{plural}/{name}", self._handle, methods=methods),
            Route(crd + "/{plural}", self._handle, methods=methods),
        ]
        return Starlette(routes=routes)

    async def _handle(self, request: Request) -> Response:
        p = request.path_params
        self.requests.append((request.method, request.url.path))
        if self._tokens and request.headers.get("authorization", "").removeprefix(
                "Bearer ") not in self._tokens:
            self.unauthorized += 1
            return _json(status_body(401, "Unauthorized", "Unauthorized"), 401)
        if self.latency_s[1] > 0 and request.query_params.get("watch") not in ("true", "1"):
            await asyncio.sleep(self._delays.uniform(*self.latency_s))
        try:
            self._injected(request)
            plural = p["plural"]
            if plural not in KINDS:
                raise ApiFailure(404, "NotFound", f"the server could not find resource {plural}")
            return await self._dispatch(request, plural, p.get("namespace"), p.get("name"),
                                        p.get("sub", ""))
        except ApiFailure as exc:
            return _json(status_body(exc.code, exc.reason, exc.message), exc.code)

    def _injected(self, request: Request) -> None:
        with self.store.lock:
            for i, (method, part, code, message) in enumerate(self._failures):
                if method == request.method and part in request.url.path:
                    del self._failures[i]
                    raise ApiFailure(code, "InternalError" if code >= 500 else "Invalid", message)

    async def _dispatch(self, request: Request, plural: str, ns: str | None, name: str | None,
                        sub: str) -> Response:
        m = request.method
        if name is None:
            if m == "GET":
                return await self._collection(request, plural, ns)
            if m == "POST":
                return _json(self.store.create(plural, await _body(request), ns), 201)
            raise ApiFailure(405, "MethodNotAllowed", f"{m} on a collection")
        if sub == "binding" and plural == "pods" and m == "POST":
            self.store.bind(name, ns or "default", await _body(request))
            return _json({"kind": "Status", "apiVersion": "v1", "status": "Success",
                          "code": 201, "metadata": {}}, 201)
        if sub == "eviction" and plural == "pods" and m == "POST":  # no PodDisruptionBudgets
            self.store.delete(plural, name, ns)  # here: inject a 429 with fail_next to refuse
            return _json({"kind": "Status", "apiVersion": "v1", "status": "Success",
                          "code": 201, "metadata": {}}, 201)
        if sub not in ("", "status"):
            raise ApiFailure(404, "NotFound", f"subresource {sub} is not served")
        if m == "GET":
            return _json(self.store.get(plural, name, ns))
        if m == "DELETE":
            return _json(self.store.delete(plural, name, ns))
        if m in ("PATCH", "PUT"):
            body = await _body(request)
            return _json(self.store.update(plural, name, ns, body, m == "PUT", sub))
        raise ApiFailure(405, "MethodNotAllowed", f"{m} on an object")

    async def _collection(self, request: Request, plural: str, ns: str | None) -> Response:
        q = request.query_params
        labels, fields = q.get("labelSelector", ""), q.get("fieldSelector", "")
        if q.get("watch") in ("true", "1"):
            timeout = float(q.get("timeoutSeconds") or 1800)
            rv = q.get("resourceVersion")
            stream = self._watch(plural, ns, labels, fields, rv, timeout)
            return StreamingResponse(stream, media_type="application/json")
        body = self.store.select_json(plural, ns, labels, fields)
        return Response(body, media_type="application/json")

    async def _watch(self, plural: str, ns: str | None, labels: str, fields: str,
                     rv_text: str | None, timeout: float) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        entry = Listener(loop, event, plural)
        with self.store.lock:
            self.store.listeners.append(entry)
        try:
            if rv_text in (None, "", "0"):
                items, rv_now = self.store.select(plural, ns, labels, fields)
                for obj in items:
                    yield event_line("ADDED", obj)
                rv = int(rv_now)
            else:
                rv = int(rv_text)
            deadline = loop.time() + timeout
            async for line in self._follow(plural, ns, labels, fields, rv, event, deadline):
                yield line
        finally:
            with self.store.lock:
                if entry in self.store.listeners:
                    self.store.listeners.remove(entry)

    async def _follow(self, plural: str, ns: str | None, labels: str, fields: str, rv: int,
                      event: asyncio.Event, deadline: float) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        while not self._closing and loop.time() < deadline:
            event.clear()
            try:
                events = self.store.events_after(rv, plural)
            except ApiFailure as exc:
                yield event_line("ERROR", status_body(exc.code, exc.reason, exc.message))
                return
            for erv, _, obj, line in events:
                rv = erv
                if Store._selected(obj, ns, labels, fields):
                    yield line
            if not events:
                try:
                    await asyncio.wait_for(event.wait(), max(0.0, deadline - loop.time()))
                except TimeoutError:
                    return


def _json(obj: Obj, code: int = 200) -> Response:
    return Response(msgspec.json.encode(obj), status_code=code, media_type="application/json")


async def _body(request: Request) -> Obj:
    try:
        body = msgspec.json.decode(await request.body())
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise ApiFailure(400, "BadRequest", f"body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiFailure(400, "BadRequest", "body must be a JSON object")
    return body


def load_seed(server: FakeApiServer, path: str) -> int:
    """Create the objects of a JSON-lines file of ``{"kind": plural, "object": {...}}``."""
    n = 0
    store = server.store
    with open(path, encoding="utf-8") as f, store.lock:
        for line in f:
            if line.strip():
                item = json.loads(line)
                kind, obj = KINDS[item["kind"]], item["object"]
                meta = obj.setdefault("metadata", {})
                store.rv += 1
                meta.setdefault("uid", str(uuid.uuid4()))
                meta["resourceVersion"] = str(store.rv)
                obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
                ns = meta.setdefault("namespace", "default") if kind.namespaced else None
                store.objects[kind.plural][store._key(kind, ns, meta["name"])] = obj
                n += 1
        store.first_rv = store.rv + 1  # a loaded store starts without watch history
    return n


def main() -> None:
    """``python -m gpupool_testing.fake_apiserver [SEED.jsonl]``: serve on 127.0.0.1 (for
    benchmarks that keep the fake out of the measured process); prints the URL and the
    number of objects loaded."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m gpupool_testing.fake_apiserver",
        description="Serve a FAKE Kubernetes API server (test support) on 127.0.0.1; print "
                    "its URL and the number of objects loaded; stop when stdin closes.")
    parser.add_argument("seed", nargs="?", help='JSON lines of {"kind": plural, "object": {...}}')
    parser.add_argument("--latency-ms", type=float, nargs=2, default=(0.0, 0.0),
                        metavar=("LOW", "HIGH"),
                        help="every request but a watch waits a uniform draw in this range")
    args = parser.parse_args()
    low, high = sorted(args.latency_ms)
    if low < 0:
        parser.exit(2, "--latency-ms: a latency cannot be negative\n")
    server = FakeApiServer((low / 1e3, high / 1e3))
    try:
        count = load_seed(server, args.seed) if args.seed else 0
    except (OSError, ValueError, KeyError) as exc:
        parser.exit(2, f"cannot load the seed file {args.seed}: {exc}\n")
    print(server.start(), count, flush=True)
    try:
        sys.stdin.read()  # until the parent closes our stdin
    finally:
        server.stop()


if __name__ == "__main__":
    main()
