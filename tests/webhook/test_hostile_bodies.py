"""Bodies no API server sends, over real HTTPS: each gets a well-formed answer — an
AdmissionReview denial naming the problem when the request's uid can be read, else HTTP
400 with ``{"error": ...}`` — and the server keeps answering."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

import pytest

from gpupool.contract.jsondepth import MAX_DEPTH

from .builders import body, pod, review
from .conftest import Webhook


def _nested(depth: int) -> bytes:
    """A pod review whose object carries a field nested ``depth`` lists deep."""
    obj = pod()
    obj["spec"]["x"] = "@"
    text = body(review(obj, uid="deep-1")).decode()
    return text.replace('"@"', "[" * depth + "]" * depth).encode()


def _long_number(digits: int) -> bytes:
    obj = pod()
    obj["spec"]["x"] = "@"
    return body(review(obj, uid="long-1")).decode().replace('"@"', "7" * digits).encode()


@pytest.mark.parametrize("depth", [1_000, 5_000, 200_000])
def test_json_nested_deeper_than_can_be_read_gets_400_naming_the_nesting(
        webhook: Webhook, depth: int) -> None:
    for path in ("/validate", "/mutate"):
        status, out = webhook.post(path, _nested(depth))
        assert status == 400 and "nested too deeply" in out["error"], out
    assert webhook.post("/validate", body(review(pod())))[1]["response"]["allowed"] is True


@pytest.fixture
def recursion_limit() -> Iterator[Callable[[int], None]]:
    """Sets the interpreter's recursion limit (as a test runner's worker may), then puts
    it back."""
    before = sys.getrecursionlimit()
    yield sys.setrecursionlimit
    sys.setrecursionlimit(before)


@pytest.mark.parametrize("limit", [200_000, 800])
@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1_000, 5_000])
def test_the_nesting_refused_does_not_depend_on_the_recursion_limit(
        webhook: Webhook, recursion_limit: Callable[[int], None], limit: int,
        depth: int) -> None:
    recursion_limit(limit)
    for path in ("/validate", "/mutate"):
        status, out = webhook.post(path, _nested(depth))
        assert status == 400 and "nested too deeply" in out["error"], out
        assert f"more than {MAX_DEPTH} levels" in out["error"]


@pytest.mark.parametrize("limit", [200_000, 800])
def test_json_nested_to_the_limit_is_judged_whatever_the_recursion_limit(
        webhook: Webhook, recursion_limit: Callable[[int], None], limit: int) -> None:
    recursion_limit(limit)
    depth = MAX_DEPTH - 6  # the review's own levels above spec.x
    status, out = webhook.post("/validate", _nested(depth))
    assert status == 200 and out["response"] == {"uid": "deep-1", "allowed": True}


@pytest.mark.parametrize("raw", [b"[" * 100_000, b'{"a":' * 50_000])
def test_unclosed_deep_json_gets_400(webhook: Webhook, raw: bytes) -> None:
    status, out = webhook.post("/validate", raw)
    assert status == 400 and "error" in out


def test_json_nested_within_reach_is_judged_as_usual(webhook: Webhook) -> None:
    status, out = webhook.post("/validate", _nested(100))
    assert status == 200 and out["response"] == {"uid": "deep-1", "allowed": True}


@pytest.mark.parametrize("digits", [4_301, 5_000, 100_000])
def test_a_number_too_long_to_read_is_denied_to_the_request_it_came_in(
        webhook: Webhook, digits: int) -> None:
    for path in ("/validate", "/mutate"):
        status, out = webhook.post(path, _long_number(digits))
        assert status == 200, out
        response = out["response"]
        assert response["uid"] == "long-1" and response["allowed"] is False
        assert response["status"]["code"] == 400
        assert "a number of more than 4300 digits" in response["status"]["message"]
    assert webhook.get("/healthz") == (200, "ok")
