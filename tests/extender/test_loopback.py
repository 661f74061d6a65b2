"""The extender served by uvicorn on 127.0.0.1, called over real HTTP as kube-scheduler does."""

from __future__ import annotations

import httpx
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.extender.edge.app import build_app
from gpupool.extender.edge.server import ThreadedServer

from .builders import Replica, pod_obj


def test_a_pod_is_filtered_prioritized_and_bound_over_loopback_http(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    pod = fake.seed("pods", pod_obj("a", {"gpupool.io/gpu-memory": "8192"}))
    with ThreadedServer(build_app(replica.extender)) as server, \
            httpx.Client(base_url=server.url, trust_env=False) as http:
        headers = {"Content-Type": "application/json"}
        filtered = http.post("/filter", json={"Pod": pod, "Nodes": None, "NodeNames": nodes},
                             headers=headers)
        assert filtered.status_code == 200 and filtered.json()["NodeNames"] == nodes
        scores = http.post("/prioritize", json={"Pod": pod, "NodeNames": nodes}).json()
        best = max(scores, key=lambda h: h["Score"])["Host"]
        bound = http.post("/bind", json={"PodName": "a", "PodNamespace": "default",
                                         "PodUID": pod["metadata"]["uid"], "Node": best})
        assert bound.json() == {"Error": ""}
        garbage = http.post("/filter", content=b"\x00garbage", headers=headers)
        assert garbage.status_code == 200 and "not valid JSON" in garbage.json()["Error"]
        assert http.get("/healthz").status_code == 200
        assert "gpupool_extender_request_seconds" in http.get("/metrics").text
    assert fake.get("pods", "a", "default")["spec"]["nodeName"] == best
