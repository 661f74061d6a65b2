"""Payloads a real kube-scheduler v1.36 sent, fed through the app (in-process).

The recordings (``../shared/fixtures/kube-scheduler-extender`` from the repository root)
use ``example.com/gpu-mem`` (GiB) and ``nvidia.com/gpu``; they are rewritten to
``gpupool.io/gpu-memory`` (MiB) and ``gpupool.io/gpu`` before they are sent. Answers
must be in the shapes the real scheduler accepts: ``NodeNames`` holding only names it
sent when node-cache capable, a ``Nodes`` NodeList otherwise; Host/Score lists with
scores 0..10; ``{"Error": ""}`` for a bind that worked.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer
from starlette.testclient import TestClient

from gpupool.extender.edge.app import build_app

from .builders import Replica, gpu_obj, node_obj

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO.parent / "shared" / "fixtures" / "kube-scheduler-extender"
GIB = 1024
GPU_NODES = {"node-a": 2, "node-b": 2, "node-c": 1}  # 16 GiB GPUs, as the recorded cluster

pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(),
                                reason=f"recorded scheduler payloads not found at {FIXTURES}")


def to_gpupool(value: Any) -> Any:
    """Rename the recorded resources to gpupool's (GiB -> MiB for memory)."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k == "example.com/gpu-mem":
                out["gpupool.io/gpu-memory"] = str(int(v) * GIB)
            elif k == "nvidia.com/gpu":
                out["gpupool.io/gpu"] = v
            else:
                out[k] = to_gpupool(v)
        return out
    if isinstance(value, list):
        return [to_gpupool(v) for v in value]
    return value


def recorded(variant: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    index = json.loads((FIXTURES / variant / "index.json").read_text())
    return [(e, to_gpupool(json.loads((FIXTURES / variant / e["file"]).read_text())))
            for e in index]


@pytest.fixture
def cluster(fake: FakeApiServer) -> Iterator[tuple[Replica, TestClient]]:
    for name, gpus in GPU_NODES.items():
        fake.seed("nodes", node_obj(name, cpu="8", memory="32Gi"))
        for j in range(gpus):
            fake.seed("gpudevices", gpu_obj(name, j, "fake-a100", 16 * GIB))
    replica = Replica(fake, scheduler_name="default-scheduler")  # the recorded profile's
    with TestClient(build_app(replica.extender)) as client:
        yield replica, client
    replica.close()


def sent_names(body: dict[str, Any]) -> list[str]:
    if body.get("NodeNames") is not None:
        return list(body["NodeNames"])
    return [n["metadata"]["name"] for n in body["Nodes"]["items"]]


def check_filter(body: dict[str, Any], answer: dict[str, Any], cache_capable: bool) -> None:
    sent = sent_names(body)
    assert answer["Error"] == ""
    if cache_capable:
        assert answer["Nodes"] is None
        passing = answer["NodeNames"]
    else:
        assert answer["NodeNames"] is None and answer["Nodes"]["metadata"] == {}
        passing = [n["metadata"]["name"] for n in answer["Nodes"]["items"]]
        sent_items = {n["metadata"]["name"]: n for n in body["Nodes"]["items"]}
        assert all(n == sent_items[n["metadata"]["name"]] for n in answer["Nodes"]["items"])
    failed = {**answer["FailedNodes"], **answer["FailedAndUnresolvableNodes"]}
    assert set(passing) <= set(sent) and set(failed) <= set(sent)
    assert sorted(passing + list(failed)) == sorted(sent)  # every node accounted for once
    assert all(reason.startswith("gpupool") for reason in failed.values())  # no node names
    for name in sent:  # the recorded cluster's GPU nodes fit these small pods
        assert (name in passing) == (name in GPU_NODES)


@pytest.mark.parametrize("variant", ["nodecache", "nonodecache"])
def test_recorded_scheduler_calls_get_well_formed_answers(
        variant: str, fake: FakeApiServer, cluster: tuple[Replica, TestClient]) -> None:
    _, client = cluster
    calls = recorded(variant)
    for _, body in calls:  # the pods the scheduler asked about exist in the API
        if "Pod" in body and fake.get("pods", body["Pod"]["metadata"]["name"], "default") is None:
            fake.seed("pods", body["Pod"])
    verbs = set()
    for entry, body in calls:
        response = client.post("/" + entry["verb"], json=body)
        assert response.status_code == 200
        answer = response.json()
        verbs.add(entry["verb"])
        if entry["verb"] == "filter":
            check_filter(body, answer, variant == "nodecache")
        elif entry["verb"] == "prioritize":
            assert {h["Host"] for h in answer} <= set(sent_names(body))
            assert all(isinstance(h["Score"], int) and 0 <= h["Score"] <= 10 for h in answer)
        else:
            assert set(answer) == {"Error"}
            pod = fake.get("pods", body["PodName"], body["PodNamespace"])
            if body["Node"] in GPU_NODES:
                assert answer["Error"] == ""
                assert pod["spec"]["nodeName"] == body["Node"]
                assert pod["metadata"]["annotations"]["gpupool.io/phase"] == "allocating"
            else:
                assert "no GPUDevice" in answer["Error"]
                assert not pod["spec"].get("nodeName")
    assert verbs == {"filter", "prioritize", "bind"}


def test_the_filter_answer_has_the_keys_and_types_the_scheduler_accepted(
        cluster: tuple[Replica, TestClient]) -> None:
    _, client = cluster
    for variant in ("nodecache", "nonodecache"):
        first = json.loads((FIXTURES / variant / "filter-1.json").read_text())
        accepted = json.loads((FIXTURES / variant / "filter-1.response.json").read_text())
        ours = client.post("/filter", json=to_gpupool(first)).json()
        assert set(ours) == set(accepted)
        assert {k: type(v) for k, v in ours.items()} == {k: type(v) for k, v in accepted.items()}
