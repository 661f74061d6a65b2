"""Prometheus /metrics of the node agent, and the log lines of Allocate and refusals."""

from __future__ import annotations

import logging
import random
import urllib.request

import grpc
import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.nodeagent.metrics import NodeMetrics, serve

from .builders import decision, pod, uuid_of
from .conftest import AgentFactory
from .kubelet_standin import FakeKubelet


def test_metrics_are_served_over_http_with_allocations_refusals_and_gpus(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer,
        caplog: pytest.LogCaptureFixture) -> None:
    metrics = NodeMetrics()
    agent = make_agent(gpus=2, split=2, metrics=metrics)
    kubelet.wait_registrations(1)
    kubelet.wait_update(lambda d: len(d) == 4)
    good = pod("good", [("main", 1, 2048, 20)],
               ann=decision("good", [(uuid_of(1), 1, 2048, 20, "main")]))
    bad = pod("bad", [("main", 1, 1024, 10)],
              ann=decision("bad", [(uuid_of(0), 0, 1024, 10, "main")], keys=None))
    apiserver.seed("pods", good)
    apiserver.seed("pods", bad)
    with caplog.at_level(logging.INFO, logger="gpupool.nodeagent"):
        kubelet.admit(good, random.Random(1))
        with pytest.raises(grpc.RpcError):
            kubelet.admit(bad, random.Random(1))
    agent.check_once()
    server = serve(metrics, "127.0.0.1", 0)
    try:
        port = server.server_port
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    finally:
        server.shutdown()
    body = text.decode()
    assert "gpupool_node_allocate_seconds_count 1.0" in body
    assert 'gpupool_node_refusals_total{reason="unsigned"} 1.0' in body
    assert f'gpupool_node_gpu_memory_allocated_mib{{gpu="{uuid_of(1)}"}} 2048.0' in body
    assert f'gpupool_node_gpu_compute_allocated_pct{{gpu="{uuid_of(1)}"}} 20.0' in body
    assert f'gpupool_node_gpu_healthy{{gpu="{uuid_of(0)}"}} 1.0' in body
    assert 'gpupool_node_isolation_provider{enforced="false",provider="none"} 1.0' in body
    logged = caplog.text
    assert f"Allocate: pod default/good container main gets {uuid_of(1)}[2048 MiB, 20 %]" \
        in logged
    assert "refused pod default/bad (unsigned)" in logged
