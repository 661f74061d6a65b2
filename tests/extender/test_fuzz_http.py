"""Seeded fuzzing of every verb over kube-scheduler's mutual TLS: bodies of random size
(1 byte to the verb's limit, the limit itself and one byte more included) and kind (a
real call padded out, a real call cut short or with bytes changed, JSON nested deep,
random bytes), sent in random pieces: every call is answered, HTTP 200 with a body in
the verb's own shape, none dropped, and the connection counts nothing as a head too
large. The malformed-JSON fuzzing of the handlers themselves is in ``test_fuzz``."""

from __future__ import annotations

import json
import random
import socket
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from gpupool_testing.fake_apiserver import FakeApiServer
from gpupool_testing.rawhttp import Answer, exchange, pieces

from gpupool.contract.jsondepth import MAX_DEPTH
from gpupool.extender.edge.sizing import BodyLimits

from .builders import pod_obj, seed_cluster
from .test_request_framing import closed_for
from .test_tls import SERVICE_NAME, Served, client_context

SEED = 20261128
CALLS = 150  # per verb, besides the limit and one byte past it
LIMITS = BodyLimits.for_cluster()
VERBS = ("filter", "prioritize", "bind", "preempt", "filter-claims", "prioritize-claims")


def is_filter_answer(a: Any) -> bool:
    return isinstance(a, dict) and isinstance(a.get("Error"), str) and \
        ("NodeNames" in a or "Nodes" in a)


SHAPES: dict[str, Callable[[Any], bool]] = {
    "filter": is_filter_answer,
    "filter-claims": is_filter_answer,
    "prioritize": lambda a: isinstance(a, list),
    "prioritize-claims": lambda a: isinstance(a, list),
    "bind": lambda a: isinstance(a, dict) and isinstance(a.get("Error"), str),
    "preempt": lambda a: isinstance(a, dict) and isinstance(a.get("NodeNameToMetaVictims"),
                                                             dict),
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, list[str]]]:
    with FakeApiServer() as fake:
        nodes = seed_cluster(fake, 3, 2)
        s = Served(fake, Path(tmp_path_factory.mktemp("fuzz-tls")))
        yield s, nodes
        s.close()


def real_call(verb: str, nodes: list[str]) -> dict[str, Any]:
    pod = pod_obj("p", {"gpupool.io/gpu": "1"})
    pod["metadata"]["uid"] = "u-p"
    if verb == "bind":
        return {"PodName": "p", "PodNamespace": "default", "PodUID": "u-p", "Node": nodes[0]}
    if verb == "preempt":
        return {"Pod": pod, "NodeNameToMetaVictims": {n: {"Pods": [{"UID": "v"}],
                                                          "NumPDBViolations": 0}
                                                      for n in nodes}}
    return {"Pod": pod, "NodeNames": nodes}


def padded(call: dict[str, Any], size: int) -> bytes:
    """``call`` with an annotation (or a spare field) making it ``size`` bytes, where it
    fits; else as much of it as ``size`` allows."""
    pod = call.get("Pod")
    where = pod["metadata"].setdefault("annotations", {}) if pod else call
    where["pad"] = ""
    bare = len(msgspec.json.encode(call))
    where["pad"] = "x" * max(0, size - bare)
    return msgspec.json.encode(call)[:size]


def body_of(kind: str, size: int, verb: str, nodes: list[str], rng: random.Random) -> bytes:
    if kind == "real":
        return padded(real_call(verb, nodes), size)
    if kind == "cut":
        return padded(real_call(verb, nodes), size + rng.randint(1, 64))[:size]
    if kind == "changed":
        raw = bytearray(padded(real_call(verb, nodes), size))
        for _ in range(rng.randint(1, 8)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        return bytes(raw)
    if kind == "deep":
        depth = rng.choice([MAX_DEPTH - 2, MAX_DEPTH + 1, size // 2])
        nest = b"[" * depth + b"]" * depth
        return (b'{"Pod":' + nest + b"}" + b" " * size)[:size]
    return rng.randbytes(size)


def sizes(limit: int, rng: random.Random) -> list[int]:
    """1 byte to ``limit``, spread over the scales, with both ends and one past."""
    spread = [max(1, round(limit ** rng.random())) for _ in range(CALLS)]
    return [1, limit, limit + 1, *spread]


def connect(served: Served) -> socket.socket:
    ctx = client_context(served.ca, served.scheduler)
    host, port = served.url.removeprefix("https://").rsplit(":", 1)
    sock = ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=60),
                           server_hostname=SERVICE_NAME)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


@pytest.mark.parametrize("verb", VERBS)
def test_every_call_of_any_size_and_chunking_gets_an_answer_in_the_verbs_shape(
        verb: str, served: tuple[Served, list[str]]) -> None:
    server, nodes = served
    rng = random.Random(f"{SEED}-{verb}")
    limit = LIMITS.of(verb)
    sock: ssl.SSLSocket | socket.socket = connect(server)
    try:
        for size in sizes(limit, rng):
            kind = rng.choice(["real", "real", "cut", "changed", "deep", "random"])
            body = body_of(kind, size, verb, nodes, rng)
            answer: Answer = exchange(sock, "POST", f"/{verb}", body, pieces(len(body), rng))
            where = f"{verb}: {kind} body of {len(body)} bytes"
            assert answer.status == 200, where
            assert SHAPES[verb](json.loads(answer.body)), f"{where}: {answer.body[:200]!r}"
            if answer.headers.get(b"connection") == b"close":
                sock.close()
                sock = connect(server)
    finally:
        sock.close()
    assert closed_for(server, "header-too-large") == 0
    refused = server.replica.extender.metrics.registry.get_sample_value(
        "gpupool_extender_refused_requests_total", {"verb": verb})
    assert refused is not None and refused >= 1  # one byte past the limit, at least
