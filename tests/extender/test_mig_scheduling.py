"""MIG through the extender: pods asking a MIG profile get a MIG device of it, whole; the
GPU in MIG mode goes to no pod; other pods never land on MIG devices."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract.annotations import decode

from .builders import Replica, gpu_obj, node_obj, pod_obj, schedule

PARENT = "GPU-m0-0"


def mig_device(profile: str, start: int, size: int, slices: int, memory_mib: int
               ) -> dict[str, Any]:
    obj = gpu_obj("m0", 0, "A100-SXM4-80GB", memory_mib)
    uuid = f"MIG-m0-0-{profile}-{start}"
    obj["metadata"]["name"] = uuid.lower().replace(".", "-")
    obj["spec"].update(uuid=uuid, mig={"parent": PARENT, "profile": profile,
                                       "placement": {"start": start, "size": size},
                                       "slices": slices, "gpuInstance": start + 1,
                                       "computeInstance": 0})
    return obj


@pytest.fixture
def cluster(fake: FakeApiServer) -> Iterator[Replica]:
    fake.seed("nodes", node_obj("m0"))
    fake.seed("nodes", node_obj("p0"))
    parent = gpu_obj("m0", 0, "A100-SXM4-80GB", 81920)
    parent["spec"]["mig"] = {"mode": "Enabled"}
    fake.seed("gpudevices", parent)
    fake.seed("gpudevices", mig_device("1g.10gb", 0, 1, 1, 9856))
    fake.seed("gpudevices", mig_device("3g.40gb", 4, 4, 3, 40192))
    fake.seed("gpudevices", gpu_obj("p0", 0, "A100-SXM4-80GB", 81920))
    replica = Replica(fake)
    yield replica
    replica.close()


def test_a_mig_pod_gets_a_device_of_its_profile_whole(fake: FakeApiServer,
                                                      cluster: Replica) -> None:
    pod = fake.seed("pods", pod_obj("small", {"mig.gpupool.io/1g.10gb": "1",
                                              "gpupool.io/gpu": "1"}))
    node, error = schedule(cluster.extender, pod, ["m0", "p0"])
    assert (node, error) == ("m0", "")
    stored = fake.get("pods", "small", "default")
    decision = decode(pod["metadata"]["uid"], stored["metadata"]["annotations"])
    (s,) = decision.allocation.slices
    assert (s.gpu_uuid, s.memory_mib, s.core_pct) == ("MIG-m0-0-1g.10gb-0", 9728, 100)
    assert decision.allocation.exclusive


def test_whole_gpus_never_come_from_a_gpu_in_mig_mode(fake: FakeApiServer,
                                                      cluster: Replica) -> None:
    first = fake.seed("pods", pod_obj("w1", {"gpupool.io/gpu": "1"}))
    assert schedule(cluster.extender, first, ["m0", "p0"]) == ("p0", "")
    second = fake.seed("pods", pod_obj("w2", {"gpupool.io/gpu": "1"}))
    node, error = schedule(cluster.extender, second, ["m0", "p0"])
    assert node is None
    assert "1 GPUs needed, node has 0" in error or "idle GPUs needed" in error


def test_a_profile_no_device_offers_is_refused_with_the_profile(fake: FakeApiServer,
                                                                cluster: Replica) -> None:
    pod = fake.seed("pods", pod_obj("mid", {"mig.gpupool.io/2g.20gb": "1",
                                            "gpupool.io/gpu": "1"}))
    result = cluster.extender.filter({"Pod": pod, "Nodes": None, "NodeNames": ["m0", "p0"]})
    assert result["NodeNames"] == []
    assert "1 MIG devices 2g.20gb needed" in result["FailedAndUnresolvableNodes"]["m0"]
