"""Every verb refuses a body nested more than ``jsondepth.MAX_DEPTH`` levels deep, in its
own shape and before decoding it, whatever the interpreter's recursion limit; a body
nested less is read as usual."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import msgspec
import pytest
from starlette.testclient import TestClient

from gpupool.contract.jsondepth import MAX_DEPTH
from gpupool.extender.edge.app import build_app

from .builders import Replica, pod_obj

VERBS = ("filter", "prioritize", "bind", "preempt")


@pytest.fixture
def client(replica: Replica) -> Iterator[TestClient]:
    with TestClient(build_app(replica.extender)) as c:
        yield c


@pytest.fixture(params=[200_000, 800], ids=["recursion limit raised", "lowered"])
def recursion_limit(request: pytest.FixtureRequest) -> Iterator[int]:
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(request.param)
    yield request.param
    sys.setrecursionlimit(before)


def nested(depth: int, nodes: list[str]) -> bytes:
    """A filter body whose pod carries a list ``depth`` levels deep in all (the body's own
    three levels above it included)."""
    pod = pod_obj("p", {"gpupool.io/gpu": "1"})
    pod["metadata"]["uid"] = "u-p"
    pod["spec"]["x"] = "@"
    text = msgspec.json.encode({"Pod": pod, "NodeNames": nodes})
    return text.replace(b'"@"', b"[" * (depth - 3) + b"]" * (depth - 3))


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1_000, 5_000])  # bind takes 16 KiB
def test_a_body_nested_too_deeply_is_refused_in_the_verbs_shape(
        client: TestClient, recursion_limit: int, nodes: list[str], verb: str,
        depth: int) -> None:
    answer = client.post(f"/{verb}", content=nested(depth, nodes))
    assert answer.status_code == 200
    if verb in ("filter", "bind"):
        assert f"nested more than {MAX_DEPTH} levels deep" in answer.json()["Error"]
    else:
        assert answer.json() in ([], {"NodeNameToMetaVictims": {}})
    metrics = client.get("/metrics").text
    assert f'gpupool_extender_refused_requests_total{{verb="{verb}"}} 1.0' in metrics


def test_a_body_nested_to_the_limit_is_read(client: TestClient, recursion_limit: int,
                                            nodes: list[str]) -> None:
    answer = client.post("/filter", content=nested(MAX_DEPTH, nodes)).json()
    assert answer["Error"] == "" and answer["NodeNames"] == nodes
