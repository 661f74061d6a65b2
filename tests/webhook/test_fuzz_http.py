"""Seeded fuzzing of the webhook's endpoints over HTTPS, as the API server reaches them:
bodies of random size (1 byte to ``MAX_BODY_BYTES``, the limit itself and one byte more
included) and kind (a real review padded out, cut short, with bytes changed, nested
deep, random bytes), sent in random pieces. Every request is answered, none dropped: an
AdmissionReview to the request's uid (HTTP 200), or ``{"error": ...}`` with 400 (no uid
to answer to) or 413 (too large); the probes answer afterwards."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from gpupool_testing.rawhttp import exchange, pieces

from gpupool.contract.jsondepth import MAX_DEPTH
from gpupool.webhook.server import MAX_BODY_BYTES

from .builders import body, pod, review
from .conftest import HOST, Webhook

SEED = 20261128
CALLS = 80  # per endpoint, besides the limit and one byte past it


def padded(size: int, uid: str) -> bytes:
    """A review of a pod whose annotation makes the body ``size`` bytes, where it fits."""
    obj = pod(annotations={"pad": ""})
    bare = len(body(review(obj, uid=uid)))
    obj["metadata"]["annotations"]["pad"] = "x" * max(0, size - bare)
    return body(review(obj, uid=uid))[:size]


def body_of(kind: str, size: int, rng: random.Random) -> bytes:
    if kind == "real":
        return padded(size, "fuzz-uid")
    if kind == "cut":
        return padded(size + rng.randint(1, 64), "fuzz-uid")[:size]
    if kind == "changed":
        raw = bytearray(padded(size, "fuzz-uid"))
        for _ in range(rng.randint(1, 8)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        return bytes(raw)
    if kind == "deep":
        depth = rng.choice([MAX_DEPTH - 8, MAX_DEPTH + 1, size // 2])
        return (b'{"request":{"uid":"deep","x":' + b"[" * depth + b"]" * depth + b"}}" +
                b" " * size)[:size]
    return rng.randbytes(size)


def well_formed(status: int, answer: Any, size: int) -> bool:
    if status == 200:
        response = answer.get("response", {})
        return answer.get("kind") == "AdmissionReview" and isinstance(
            response.get("allowed"), bool) and isinstance(response.get("uid"), str)
    expected = 413 if size > MAX_BODY_BYTES else 400
    return status == expected and isinstance(answer.get("error"), str)


@pytest.mark.parametrize("path", ["/validate", "/mutate"])
def test_every_review_of_any_size_and_chunking_gets_a_well_formed_answer(
        webhook: Webhook, path: str) -> None:
    rng = random.Random(f"{SEED}-{path}")
    spread = [max(1, round(MAX_BODY_BYTES ** rng.random())) for _ in range(CALLS)]
    for size in [1, MAX_BODY_BYTES, MAX_BODY_BYTES + 1, *spread]:
        kind = rng.choice(["real", "real", "cut", "changed", "deep", "random"])
        sent = body_of(kind, size, rng)
        with webhook.connect() as sock:
            answer = exchange(sock, "POST", path, sent, pieces(len(sent), rng), host=HOST)
        decoded = json.loads(answer.body)
        assert well_formed(answer.status, decoded, len(sent)), \
            f"{path}: {kind} body of {len(sent)} bytes: {answer.status} {answer.body[:200]!r}"
        if kind == "real" and answer.status == 200:
            assert decoded["response"]["uid"] == "fuzz-uid"
    assert webhook.get("/healthz") == (200, "ok")
