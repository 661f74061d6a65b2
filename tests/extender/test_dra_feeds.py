"""The extender watches ResourceSlices and ResourceClaims through lightkube over HTTP (the
FAKE API server serving the recorded v1.36 objects): claims are counted once listed, a
deleted claim frees its share, and an API without DRA does not stop the extender."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer
from waiting import wait_for

from gpupool.contract import dra
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.state.feeds import start_claim_feeds, start_feeds
from gpupool.extender.state.signatures import DecisionCheck
from gpupool.kube.api import DraApi, KubeApi

from .builders import Replica, gpu_obj, local_keys, node_obj, pod_obj
from .test_dra_accounting import (
    A100,
    CLAIM_A,
    CLAIM_B,
    DRA_NODE,
    MODE,
    dra_gpus,
    fixture,
    recorded,
    recorded_claims,
)


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.seed("nodes", node_obj(DRA_NODE, labels=MODE))
        server.seed("nodes", node_obj("plain"))
        for gpu in [*dra_gpus(), gpu_obj("plain", 0, memory_mib=81920)]:
            server.seed("gpudevices", gpu)
        yield server


def held(cache: ClusterCache, uid: str) -> bool:
    with cache.lock:
        cache.flush()
        return dra.claim_key(uid) in cache.state.allocations


@recorded
def test_claims_served_by_the_api_server_are_counted_and_a_deleted_one_is_let_go(
        fake: FakeApiServer) -> None:
    fake.seed("resourceslices", fixture("resourceslice-consumable-capacity.json"))
    for obj in recorded_claims():
        fake.seed("resourceclaims", obj)
    api = DraApi.connect(server=fake.url)
    cache = ClusterCache(decisions=DecisionCheck(local_keys()))
    feeds = start_feeds(api, cache, watch_timeout_s=2)
    try:
        # slices and claims come on two feeds: wait for both, not for one then assert the other
        assert wait_for(lambda: held(cache, CLAIM_A) and held(cache, CLAIM_B)
                        and cache.dra.synced == {"resourceslices", "resourceclaims"})
        assert len(cache.dra.slices["gpu-node-1-gpu.gpupool.io"]) == 2
        i = cache.state.index[DRA_NODE]
        assert int(cache.state.core_free[i, cache.state.gpu_position(DRA_NODE, A100)]) == 40
        fake.delete("resourceclaims", "dra-a-gpu-sqmq8", "dra-demo")
        assert wait_for(lambda: not held(cache, CLAIM_A))
        assert held(cache, CLAIM_B)
    finally:
        feeds.stop(timeout_s=0.0)
        api.close()


def test_a_plain_kube_api_starts_no_claim_feeds(fake: FakeApiServer) -> None:
    api = KubeApi.connect(server=fake.url)
    try:
        assert start_claim_feeds(api, ClusterCache()) == []
    finally:
        api.close()


def test_an_api_server_without_dra_leaves_the_extender_serving(fake: FakeApiServer) -> None:
    fake.fail_next("GET", "resourceclaims", 404, "the server could not find the resource")
    api = DraApi.connect(server=fake.url)
    cache = ClusterCache(decisions=DecisionCheck(local_keys()))
    feeds = start_feeds(api, cache, watch_timeout_s=2)  # returns: claims are not waited for
    try:
        assert {"nodes", "devices", "pods", "ledgers"} <= cache.synced
        assert wait_for(lambda: "resourceclaims" in cache.dra.synced)  # listed on retry
    finally:
        feeds.stop(timeout_s=0.0)
        api.close()


def test_bind_refuses_a_device_plugin_pod_sent_to_a_dra_node(fake: FakeApiServer) -> None:
    replica = Replica(fake)
    try:
        assert wait_for(lambda: DRA_NODE in replica.cache.state.index)
        pod = fake.seed("pods", pod_obj("p", {"gpupool.io/gpu": "1"}))
        meta = pod["metadata"]
        answer = replica.extender.bind({"PodName": "p", "PodNamespace": meta["namespace"],
                                        "PodUID": meta["uid"], "Node": DRA_NODE})
        assert "Dynamic Resource Allocation" in answer["Error"]
        assert fake.get("pods", "p", "default")["spec"].get("nodeName") is None
        assert replica.extender.bind({"PodName": "p", "PodNamespace": meta["namespace"],
                                      "PodUID": meta["uid"], "Node": "plain"})["Error"] == ""
    finally:
        replica.close()
