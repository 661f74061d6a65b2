"""Review: GPUPermissions fail open while they cannot be listed.

A GPUPermission is a security control (which nodes and GPUs a tenant may use), and a
*broken* one rightly permits nothing. But when the extender cannot list GPUPermissions
at start (a 403 from a mis-bound role, a 500, a slow API server) it waits 10 s, logs an
error and serves anyway — and it reports itself ready (``Extender.ready`` needs nodes,
devices, pods and ledgers only). Until the listing succeeds, a tenant confined to zone
z1 is placed anywhere. Only a 404 (the CRD is not installed: no permission can exist)
makes serving without them safe.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.extender.metrics import Metrics
from gpupool.extender.service import Extender, Settings
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.state.feeds import start_feeds
from gpupool.extender.state.signatures import DecisionCheck
from gpupool.kube.api import KubeApi
from tests.extender.builders import decision_keys, gpu_obj, node_obj, pod_obj, seed_cluster


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


def test_a_confined_tenant_is_never_placed_outside_its_permission_while_they_cannot_be_listed(
        fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 2, 2)
    fake.seed("nodes", node_obj("z", labels={"zone": "z1"}))
    fake.seed("gpudevices", gpu_obj("z", 0))
    fake.seed("gpupermissions", {"metadata": {"name": "zone-z1"}, "spec": {
        "tenants": ["lab"], "nodeSelector": {"matchLabels": {"zone": "z1"}}}})
    for _ in range(200):  # every listing and watch of GPUPermissions is refused
        fake.fail_next("GET", "gpupermissions", 403, "forbidden")
    api = KubeApi.connect(server=fake.url)
    keys = decision_keys(api)
    cache = ClusterCache(decisions=DecisionCheck(keys))
    # each listing may take a loaded machine seconds; the refused GPUPermissions are waited
    # for lenient_sync_s (by default LENIENT_SYNC_S, 10 s), then the extender starts unready
    feeds = start_feeds(api, cache, watch_timeout_s=2, sync_timeout_s=30, lenient_sync_s=0.5)
    ext = Extender(cache, Settings("best-fit"), Metrics(), api, keys)
    try:
        pod = fake.seed("pods", pod_obj("p", {"gpupool.io/gpu": "1"}, ns="lab"))
        placed = set(ext.filter({"Pod": pod, "NodeNames": [*nodes, "z"]})["NodeNames"] or ())
        assert not (ext.ready() and placed - {"z"}), f"lab may be placed on {sorted(placed)}"
    finally:
        ext.close()
        feeds.stop(timeout_s=0.0)
        api.close()
