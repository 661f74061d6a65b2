"""TenantQuotas and GPUPermissions at start, against the FAKE API server: a 404 (their CRD
is absent, so none can exist) lets the replica serve; any other failure to list them keeps
it unready until a listing succeeds, and ``/readyz`` names them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.extender.metrics import Metrics
from gpupool.extender.service import Extender, Settings
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.state.feeds import LENIENT_SYNC_S, Feeds, start_feeds
from gpupool.extender.state.signatures import DecisionCheck
from gpupool.kube.api import KubeApi
from tests.extender.builders import decision_keys, pod_obj, seed_cluster
from tests.waiting import wait_for


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


def started(fake: FakeApiServer, lenient_sync_s: float = LENIENT_SYNC_S
            ) -> tuple[Extender, Feeds, KubeApi]:
    api = KubeApi.connect(server=fake.url)
    keys = decision_keys(api)
    cache = ClusterCache(decisions=DecisionCheck(keys))
    # each listing may take a loaded machine seconds (start_feeds raises past the timeout);
    # the lenient kinds are waited for lenient_sync_s at most
    feeds = start_feeds(api, cache, watch_timeout_s=2, sync_timeout_s=30,
                        lenient_sync_s=lenient_sync_s)
    return Extender(cache, Settings("best-fit"), Metrics(), api, keys), feeds, api


@pytest.mark.parametrize("kind", ["gpupermissions", "tenantquotas"])
def test_an_absent_crd_counts_as_none_and_the_replica_serves(fake: FakeApiServer,
                                                             kind: str) -> None:
    nodes = seed_cluster(fake, 1, 2)
    for _ in range(2):
        fake.fail_next("GET", kind, 404, "the server could not find the requested resource")
    ext, feeds, api = started(fake)
    try:
        assert wait_for(ext.ready)
        pod = fake.seed("pods", pod_obj("p", {"gpupool.io/gpu": "1"}, ns="lab"))
        assert ext.filter({"Pod": pod, "NodeNames": nodes})["NodeNames"] == nodes
    finally:
        ext.close()
        feeds.stop(timeout_s=0.0)
        api.close()


@pytest.mark.parametrize(("kind", "code"), [("tenantquotas", 500)])  # 403: tests/review
def test_any_other_listing_failure_keeps_the_replica_unready_until_a_listing_succeeds(
        fake: FakeApiServer, kind: str, code: int) -> None:
    seed_cluster(fake, 1, 2)
    # refused until the test lifts the fault; the start waits for them (here 0.5 s, not the
    # default LENIENT_SYNC_S), then returns with the replica unready
    for _ in range(1000):
        fake.fail_next("GET", kind, code, "refused")
    ext, feeds, api = started(fake, lenient_sync_s=0.5)
    try:
        assert kind not in ext.cache.synced and not ext.ready()
        fake.forget_failures(kind)
        assert wait_for(ext.ready)  # the informer lists again (every second), and succeeds
    finally:
        ext.close()
        feeds.stop(timeout_s=0.0)
        api.close()
