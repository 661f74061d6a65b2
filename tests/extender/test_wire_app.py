"""The app's bare ASGI verbs: body chunks, disconnects, oversize bodies, never a 500, bind
off the event loop; everything else still served by starlette."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import MutableMapping
from typing import Any

import msgspec
import pytest
from lightkube.resources.core_v1 import Node
from prometheus_client import generate_latest
from starlette.testclient import TestClient

from gpupool.core.policies import DEFAULT_POLICY
from gpupool.extender.edge.app import build_app
from gpupool.extender.edge.sizing import BodyLimits
from gpupool.extender.metrics import Metrics
from gpupool.extender.service import Extender, Settings
from gpupool.extender.state.cache import ClusterCache

from .builders import gpu_obj, node_obj, pod_obj

NODES = ["n0", "n1"]


@pytest.fixture
def ext() -> Extender:
    cache = ClusterCache()
    cache.sync_nodes([Node.from_dict(node_obj(n)) for n in NODES])
    cache.sync_devices([gpu_obj(n, j) for n in NODES for j in range(2)])
    return Extender(cache, Settings(DEFAULT_POLICY), Metrics())


def filter_body() -> bytes:
    return msgspec.json.encode({"Pod": pod_obj("p", {"gpupool.io/gpu": "1"}),
                                "Nodes": None, "NodeNames": NODES})


def call(app: Any, path: str, messages: list[dict[str, Any]],
         headers: list[tuple[bytes, bytes]] | None = None) -> list[MutableMapping[str, Any]]:
    """Run one ASGI request whose receive() yields ``messages``; what the app sent."""
    sent: list[MutableMapping[str, Any]] = []
    queue = list(messages)

    async def receive() -> dict[str, Any]:
        return queue.pop(0) if queue else {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": headers or []}
    asyncio.run(app(scope, receive, send))
    return sent


def test_a_body_in_chunks_is_read_whole(ext: Extender) -> None:
    body = filter_body()
    chunks = [{"type": "http.request", "body": body[i:i + 100], "more_body": True}
              for i in range(0, len(body), 100)]
    chunks[-1]["more_body"] = False
    start, answer = call(build_app(ext), "/filter", chunks)
    assert start["status"] == 200
    assert (b"content-length", str(len(answer["body"])).encode()) in start["headers"]
    assert msgspec.json.decode(answer["body"])["NodeNames"] == NODES


def test_a_client_gone_before_the_body_ends_gets_nothing(ext: Extender) -> None:
    sent = call(build_app(ext), "/filter", [
        {"type": "http.request", "body": filter_body()[:50], "more_body": True}])
    assert sent == []


def test_an_oversize_body_is_answered_with_an_error(ext: Extender) -> None:
    body = filter_body()
    app = build_app(ext, BodyLimits(100, 100, 100, 10_000))
    _, answer = call(app, "/filter", [
        {"type": "http.request", "body": body[:80], "more_body": True},
        {"type": "http.request", "body": body[80:], "more_body": False}])
    assert "larger than the 100 bytes" in msgspec.json.decode(answer["body"])["Error"]
    assert app.reading == 0  # nothing is left reserved


def test_a_declared_oversize_body_is_refused_unread_with_the_limit_named(ext: Extender) -> None:
    body = filter_body()
    app = build_app(ext, BodyLimits(100, 100, 100, 10_000))
    headers = [(b"content-length", str(len(body)).encode())]
    _, answer = call(app, "/filter", [
        {"type": "http.request", "body": body[:80], "more_body": True},
        {"type": "http.request", "body": body[80:], "more_body": False}], headers)
    error = msgspec.json.decode(answer["body"])["Error"]
    assert f"the request body is {len(body)} bytes, more than the 100" in error
    assert 'gpupool_extender_refused_requests_total{verb="filter"} 1.0' in \
        generate_latest(ext.metrics.registry).decode()


def test_bodies_past_the_budget_wait_for_nothing_and_are_refused(ext: Extender) -> None:
    body = filter_body()
    app = build_app(ext, BodyLimits(len(body), len(body), 100, len(body)))
    app.reading = 1  # another call is being read
    headers = [(b"content-length", str(len(body)).encode())]
    _, answer = call(app, "/filter", [
        {"type": "http.request", "body": body, "more_body": False}], headers)
    assert "would pass the extender's budget" in msgspec.json.decode(answer["body"])["Error"]
    app.reading = 0
    _, answer = call(app, "/filter", [
        {"type": "http.request", "body": body, "more_body": False}], headers)
    assert msgspec.json.decode(answer["body"])["NodeNames"] == NODES


def test_a_failure_inside_is_an_error_answer_not_a_500(ext: Extender,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(body: bytes) -> bytes:
        raise RuntimeError("boom")

    monkeypatch.setattr(ext, "filter_json", broken)
    with TestClient(build_app(ext)) as client:
        response = client.post("/filter", content=filter_body())
    assert response.status_code == 200
    assert response.json()["Error"] == "gpupool filter: internal error: RuntimeError: boom"


def test_every_verb_but_a_small_filter_runs_off_the_event_loop(ext: Extender,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    threads: dict[str, str] = {}

    def spy(verb: str, answer: Any) -> Any:
        def handler(body: Any) -> Any:
            threads[verb] = threading.current_thread().name
            return answer
        return handler

    monkeypatch.setattr(ext, "bind", spy("bind", {"Error": ""}))
    monkeypatch.setattr(ext, "preempt", spy("preempt", {"NodeNameToMetaVictims": {}}))
    monkeypatch.setattr(ext, "filter_json", spy("filter", b'{"Error":""}'))
    monkeypatch.setattr(ext, "prioritize_json", spy("prioritize", b"[]"))
    app = build_app(ext)
    app.inline_bytes = 0  # every body "large"
    with TestClient(app) as client:
        for verb in ("filter", "prioritize", "preempt"):
            assert client.post(f"/{verb}", content=filter_body()).status_code == 200
        answer = client.post("/bind", json={"PodName": "p", "Node": "n0"}).json()
    assert answer == {"Error": ""}
    assert threads["bind"].startswith("extender-bind")
    assert all(threads[v].startswith("extender-decide") for v in ("filter", "prioritize",
                                                                  "preempt"))
    with TestClient(build_app(ext)) as client:  # small: decided where it is read
        client.post("/filter", content=filter_body())
    assert not threads["filter"].startswith("extender-")


def test_other_methods_and_paths_go_to_starlette(ext: Extender) -> None:
    with TestClient(build_app(ext)) as client:
        refused = client.get("/filter")
        assert refused.status_code == 405 and refused.headers["allow"] == "POST"
        assert client.post("/nothing-here", content=b"{}").status_code == 404
        assert client.get("/healthz").text == "ok"
        client.post("/filter", content=filter_body())
        assert 'gpupool_extender_request_seconds_count{verb="filter"} 1.0' in \
            client.get("/metrics").text
