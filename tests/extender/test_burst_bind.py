"""A burstable pod through the extender: placed and charged by its request, its limit
recorded in the decision (and its GPULedger entry) at bind."""

from __future__ import annotations

import json

from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract.annotations import decode

from .builders import Replica, pod_obj, schedule


def test_bind_records_a_burstable_slices_request_and_limit(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    pod = fake.seed("pods", pod_obj(
        "serve", {"gpupool.io/gpu-memory": "4096", "gpupool.io/gpu-core": "20"},
        annotations={"gpupool.io/gpu-memory-limit": "12288", "gpupool.io/gpu-core-limit": "60"}))
    node, error = schedule(replica.extender, pod, nodes)
    assert error == "" and node is not None
    stored = fake.get("pods", "serve", "default")
    (s,) = decode(pod["metadata"]["uid"], stored["metadata"]["annotations"]).allocation.slices
    assert (s.memory_mib, s.core_pct, s.memory_limit_mib, s.core_limit_pct) == (4096, 20,
                                                                                12288, 60)
    entry = fake.get("gpuledgers", node)["spec"]["entries"][pod["metadata"]["uid"]]
    gpu = json.loads(entry["allocation"])["containers"][0]["gpus"][0]
    assert (gpu["memoryMiB"], gpu["memoryLimitMiB"]) == (4096, 12288)
    held = replica.cache.state.usage().allocated_milli
    assert held == 200  # 20 % of one GPU: the request, not the limit


def test_a_burst_limit_below_the_request_is_refused_at_filter(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    pod = fake.seed("pods", pod_obj("low", {"gpupool.io/gpu-memory": "4096"},
                                    annotations={"gpupool.io/gpu-memory-limit": "1024"}))
    answer = replica.extender.filter({"Pod": pod, "NodeNames": nodes})
    assert "limit 1024 MiB is below its request of 4096 MiB" in answer["Error"]
