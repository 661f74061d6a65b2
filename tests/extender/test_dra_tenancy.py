"""Tenancy covers ResourceClaims: a held claim counts against its namespace's quota, and the
``filter-claims`` verb refuses a claim pod what its TenantQuota or GPUPermission refuses a
device-plugin pod, with the same sentence."""

from __future__ import annotations

from typing import Any

import msgspec
from lightkube.resources.core_v1 import Node

from gpupool.contract import dra
from gpupool.core.classes import ResourceClass
from gpupool.core.quota import Limit
from gpupool.core.selector import Selector
from gpupool.core.tenants import Permission, TenantBook, TenantQuota
from gpupool.extender.edge.app import build_verbs, verb_handlers
from gpupool.extender.metrics import Metrics
from gpupool.extender.service import Extender, Settings
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.state.signatures import DecisionCheck

from .builders import gpu_obj, local_keys, node_obj, pod_obj
from .test_deploy import scheduler_config
from .test_dra_prioritize import NS, ask, claim, claim_pod

MODE = {dra.NODE_MODE_LABEL: dra.MODE_DRA}
NODES = ["d0", "d1", "plain"]


def zoned() -> ClusterCache:
    """DRA nodes d0 (zone z1) and d1 (zone z2), device-plugin node plain (z1), 2 GPUs each."""
    cache = ClusterCache(decisions=DecisionCheck(local_keys()))
    cache.sync_nodes([Node.from_dict(node_obj("d0", labels={**MODE, "zone": "z1"})),
                      Node.from_dict(node_obj("d1", labels={**MODE, "zone": "z2"})),
                      Node.from_dict(node_obj("plain", labels={"zone": "z1"}))])
    cache.sync_devices([gpu_obj(n, j, memory_mib=81920) for n in NODES for j in range(2)])
    return cache


def quota(gpus: int) -> TenantBook:
    return TenantBook([TenantQuota("team", frozenset({NS}), Limit(gpus=gpus))])


def filter_claims(ext: Extender, pod: dict[str, Any], nodes: list[str] = NODES
                  ) -> dict[str, Any]:
    body = msgspec.json.encode({"Pod": pod, "NodeNames": nodes})
    answer: dict[str, Any] = msgspec.json.decode(verb_handlers(ext)["filter-claims"](body))
    return answer


def test_held_claims_are_charged_to_their_namespace_and_class_and_refunded_when_deleted(
) -> None:
    cache = zoned()
    cache.catalogue.classes.put(ResourceClass("big"))
    held = claim("held", [ask(device_class="big.gpupool.io")], allocated_on=("d0", 0, None))
    with cache.lock:
        cache.dra.sync_claims(cache, [held])
    book = cache.catalogue.quotas
    assert (book.used_by_tenant(NS).gpus, book.used_by_class(NS, "big").gpus) == (1, 1)
    assert book.used_by_tenant(NS).memory_mib == 81920  # the whole GPU it holds
    with cache.lock:
        cache.dra.claim_event(cache, "DELETED", held)
    assert book.used_by_tenant(NS).gpus == 0


def test_a_claim_pod_over_its_tenant_quota_is_refused_with_the_quota_reason_on_every_node(
) -> None:
    cache = zoned()
    cache.catalogue.tenants = quota(1)
    with cache.lock:
        cache.dra.sync_claims(cache, [claim("held", [ask()], allocated_on=("d0", 0, None)),
                                      claim("new", [ask()])])
    ext = Extender(cache, Settings("best-fit"), Metrics())
    answer = filter_claims(ext, claim_pod("p", ("gpu", "new")))
    refused = {**answer["FailedNodes"], **answer["FailedAndUnresolvableNodes"]}
    assert answer["NodeNames"] == [] and set(refused) == set(NODES)
    # a device-plugin pod of the namespace, asking as much, is told the very same sentence
    plugin = pod_obj("q", {"gpupool.io/gpu": "1"}, ns=NS)
    plugin["metadata"]["uid"] = "uid-q"
    theirs = ext.filter({"Pod": plugin, "NodeNames": ["plain"]})["FailedNodes"]["plain"]
    assert "quota of tenant team exceeded: 1 GPUs asked, 1 of 1 in use" in theirs
    assert refused["d1"] == refused["plain"] == theirs


def test_a_claim_pod_within_its_quota_passes_every_node() -> None:
    cache = zoned()
    cache.catalogue.tenants = quota(2)
    with cache.lock:
        cache.dra.sync_claims(cache, [claim("held", [ask()], allocated_on=("d0", 0, None)),
                                      claim("new", [ask()])])
    ext = Extender(cache, Settings("best-fit"), Metrics())
    assert filter_claims(ext, claim_pod("p", ("gpu", "new")))["NodeNames"] == NODES


def test_a_claim_pod_is_refused_the_dra_nodes_outside_its_gpu_permission_naming_it() -> None:
    cache = zoned()
    zone = Selector.from_spec({"matchLabels": {"zone": "z1"}})
    cache.catalogue.permissions.put(Permission("zone-one", frozenset({NS}), nodes=zone))
    with cache.lock:
        cache.dra.sync_claims(cache, [claim("new", [ask(memory="10Gi", cores="20")])])
    ext = Extender(cache, Settings("best-fit"), Metrics())
    answer = filter_claims(ext, claim_pod("p", ("gpu", "new")), ["d0", "d1", "elsewhere"])
    assert answer["NodeNames"] == ["d0", "elsewhere"]  # no gpupool GPUs: the DRA plugin's call
    why = answer["FailedAndUnresolvableNodes"]["d1"]
    assert "GPUPermission zone-one" in why and "0 here" in why, why


def test_a_tenant_permitted_no_gpu_is_refused_every_node_naming_its_permission() -> None:
    cache = zoned()
    nowhere = Selector.from_spec({"matchLabels": {"zone": "z9"}})
    cache.catalogue.permissions.put(Permission("zone-nine", frozenset({NS}), nodes=nowhere))
    with cache.lock:
        cache.dra.sync_claims(cache, [claim("new", [ask()])])
    ext = Extender(cache, Settings("best-fit"), Metrics())
    answer = filter_claims(ext, claim_pod("p", ("gpu", "new")))
    assert answer["NodeNames"] == []
    assert all("zone-nine" in why for why in answer["FailedAndUnresolvableNodes"].values())
    assert set(answer["FailedAndUnresolvableNodes"]) == set(NODES)


def test_pods_without_gpupool_claims_get_every_node_back_even_when_their_tenant_is_full(
) -> None:
    cache = zoned()
    cache.catalogue.tenants = quota(0)
    ext = Extender(cache, Settings("best-fit"), Metrics())
    plugin = pod_obj("q", {"gpupool.io/gpu": "1"}, ns=NS)  # the main entry's filter decides
    with cache.lock:
        cache.dra.sync_claims(cache, [claim("nic", [ask(device_class="nic.example.com")])])
    for pod in (pod_obj("cpu-only", ns=NS), plugin, claim_pod("p", ("nic", "nic")),
                claim_pod("r", ("gpu", "not-made-yet"))):
        answer = filter_claims(ext, pod)
        assert answer["NodeNames"] == NODES and not answer["FailedNodes"], answer
    assert "Error" in filter_claims(ext, {"metadata": "broken"})  # bad input: a clear error


def test_the_chart_sends_claim_pods_to_filter_claims_and_blocks_while_the_extender_is_down(
) -> None:
    main, claims = scheduler_config()["extenders"]
    assert claims["filterVerb"] == "filter-claims" and "managedResources" not in claims
    assert claims["ignorable"] is False and main["ignorable"] is False
    assert {f"/{claims['filterVerb']}", f"/{claims['prioritizeVerb']}"} <= build_verbs(
        Extender(zoned(), Settings("best-fit"), Metrics())).paths()
