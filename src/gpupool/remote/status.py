"""A small HTTP endpoint for probes and the node agent: GET only, JSON answers.

The slice server and the sidecar each answer a few paths (``routes``: path -> a
function giving the status code and the JSON body). Requests are read with limits —
the request head within ``HEAD_S`` seconds and ``MAX_HEAD`` bytes — and every answer
closes its connection; anything else gets 400, 404 or 405 with the reason in the body.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from gpupool.remote import frames
from gpupool.remote.listening import listen

log = logging.getLogger(__name__)

MAX_HEAD = 8192
HEAD_S = 5.0
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           503: "Service Unavailable"}

Route = Callable[[], tuple[int, Any]]


def _answer(code: int, body: Any) -> bytes:
    data = json.dumps(body, sort_keys=True).encode() + b"\n"
    head = (f"HTTP/1.1 {code} {REASONS.get(code, 'Error')}\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n")
    return head.encode() + data


def respond(routes: Mapping[str, Route], head: bytes) -> bytes:
    """The answer to one request head (pure, for tests)."""
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return _answer(400, {"error": f"not an HTTP request line: {line[:80]!r}"})
    method, target = parts[0], parts[1].split("?", 1)[0]
    route = routes.get(target)
    if route is None:
        return _answer(404, {"error": f"no such path {target[:80]!r}", "paths": sorted(routes)})
    if method != "GET":
        return _answer(405, {"error": f"{method[:16]} is not served; use GET"})
    code, body = route()
    return _answer(code, body)


async def serve(host: str, port: int, routes: Mapping[str, Route]) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_S)
            answer = respond(routes, head)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            answer = _answer(400, {"error": f"no complete request head of at most "
                                            f"{MAX_HEAD} bytes within {HEAD_S:g} s"})
        except (ConnectionError, OSError):
            answer = b""
        try:
            writer.write(answer)
            await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            await frames.close(writer)
    return await listen(handle, host, port, "the status endpoint", limit=MAX_HEAD)
