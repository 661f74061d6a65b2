"""gpupool's packing for DRA pods: a pod's unallocated ResourceClaims become a core request,
and prioritize ranks the DRA nodes with the configured policy on the state that holds
every claim and decision."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from lightkube.resources.core_v1 import Node

from gpupool.contract import dra
from gpupool.core.errors import InvalidInput
from gpupool.core.request import Mode, PodRequest
from gpupool.extender.dra.drapods import claim_names, claims_request
from gpupool.extender.edge.app import build_verbs, verb_handlers
from gpupool.extender.metrics import Metrics
from gpupool.extender.service import Extender, Settings
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.state.draclaims import DraClaims
from gpupool.extender.state.signatures import DecisionCheck

from .builders import gpu_obj, local_keys, node_obj, pod_obj

MODE = {dra.NODE_MODE_LABEL: dra.MODE_DRA}
NS = "team-a"


def claim(name: str, requests: list[dict[str, Any]], uid: str | None = None,
          allocated_on: tuple[str, int, dict[str, str] | None] | None = None
          ) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS, "uid": uid or f"uid-{name}"},
        "spec": {"devices": {"requests": requests}}}
    if allocated_on is not None:
        node, index, consumed = allocated_on
        result: dict[str, Any] = {"driver": dra.DRIVER, "pool": node, "device": f"gpu-{index}",
                                  "request": requests[0]["name"]}
        if consumed:
            result["consumedCapacity"] = consumed
        obj["status"] = {"allocation": {"devices": {"results": [result]}}}
    return obj


def ask(name: str = "gpu", device_class: str = "gpu.gpupool.io", count: int | None = None,
        **capacity: str) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class, "allocationMode": "ExactCount"}
    if count is not None:
        exactly["count"] = count
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    return {"name": name, "exactly": exactly}


def claim_pod(name: str, *claims: tuple[str, str], made: dict[str, str] | None = None
              ) -> dict[str, Any]:
    """A pod using claims: (entry name, claim name) direct, or (entry, "template:<t>")."""
    pod = pod_obj(name, ns=NS)
    pod["metadata"]["uid"] = f"uid-{name}"
    entries = []
    for entry, target in claims:
        key = "resourceClaimTemplateName" if target.startswith("template:") else \
            "resourceClaimName"
        entries.append({"name": entry, key: target.removeprefix("template:")})
    pod["spec"]["resourceClaims"] = entries
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": e} for e, _ in claims]
    if made:
        pod["status"]["resourceClaimStatuses"] = [
            {"name": e, "resourceClaimName": c} for e, c in made.items()]
    return pod


def base(pod: dict[str, Any]) -> PodRequest:
    return PodRequest(pod["metadata"]["uid"], 1000, 1024, tenant=NS)


def claims_of(*objs: dict[str, Any]) -> DraClaims:
    claims = DraClaims()
    cache = ClusterCache()
    for obj in objs:
        claims.claim_event(cache, "ADDED", obj)
    return claims


def test_a_claim_of_10gi_and_30_cores_is_a_shared_slice_of_one_gpu() -> None:
    pod = claim_pod("p", ("gpu", "c1"))
    request = claims_request(pod, base(pod), claims_of(claim("c1", [ask(memory="10Gi",
                                                                            cores="30")])),
                             frozenset())
    (demand,) = request.gpus
    assert (demand.count, demand.memory_mib, demand.core_pct, demand.mode) == \
        (1, 10240, 30, Mode.SHARED)
    assert (request.cpu_milli, request.memory_mib, request.tenant) == (1000, 1024, NS)


def test_a_template_claim_is_found_through_the_pods_claim_statuses() -> None:
    pod = claim_pod("p", ("gpu", "template:slice"), made={"gpu": "p-gpu-x7"})
    assert claim_names(pod) == ["p-gpu-x7"]
    claims = claims_of(claim("p-gpu-x7", [ask(memory="4Gi", cores="10")]))
    assert claims_request(pod, base(pod), claims, frozenset()).gpus[0].memory_mib == 4096
    not_made_yet = claim_pod("q", ("gpu", "template:slice"))
    assert claims_request(not_made_yet, base(not_made_yet), claims, frozenset()).gpus == ()


@pytest.mark.parametrize(("capacity", "mode", "memory", "core"), [
    ({}, Mode.EXCLUSIVE, 0, 0),
    ({"memory": "8Gi"}, Mode.SHARED, 8192, 100),
    ({"cores": "20"}, Mode.EXCLUSIVE, 0, 0),
    ({"memory": "1536Mi", "cores": "0.5"}, Mode.SHARED, 1536, 1),
], ids=["no capacity: a whole GPU", "memory only: all of the compute with it",
        "cores only: all of the memory, so a whole GPU", "fractions round up"])
def test_what_a_claim_does_not_ask_it_consumes_whole(capacity: dict[str, str], mode: Mode,
                                                    memory: int, core: int) -> None:
    pod = claim_pod("p", ("gpu", "c"))
    request = claims_request(pod, base(pod), claims_of(claim("c", [ask(count=2, **capacity)])),
                             frozenset())
    (demand,) = request.gpus
    assert (demand.count, demand.mode) == (2, mode)
    if mode is Mode.SHARED:
        assert (demand.memory_mib, demand.core_pct) == (memory, core)


def test_other_drivers_allocated_claims_and_all_mode_ask_nothing_of_gpupool() -> None:
    pod = claim_pod("p", ("a", "nic"), ("b", "done"), ("c", "all"), ("d", "big"))
    all_mode = ask(device_class="a100.gpupool.io")
    all_mode["exactly"] = {**all_mode["exactly"], "allocationMode": "All"}
    claims = claims_of(claim("nic", [ask(device_class="nic.example.com")]),
                       claim("done", [ask()], allocated_on=("n0", 0, None)),
                       claim("all", [all_mode]),
                       claim("big", [ask(device_class="big-mem.gpupool.io", memory="1Gi",
                                         cores="5")]))
    request = claims_request(pod, base(pod), claims, frozenset({"big-mem"}))
    assert [d.memory_mib for d in request.gpus] == [1024]
    assert request.gpu_class == "big-mem"
    unknown = claims_request(pod, base(pod), claims, frozenset())
    assert unknown.gpu_class is None  # a class the extender does not know: no narrowing


def test_a_first_available_request_is_scored_by_its_first_choice() -> None:
    pod = claim_pod("p", ("gpu", "c"))
    sub = {"name": "small", "deviceClassName": "gpu.gpupool.io",
           "capacity": {"requests": {"memory": "2Gi", "cores": "5"}}}
    claims = claims_of(claim("c", [{"name": "gpu", "firstAvailable": [sub]}]))
    assert claims_request(pod, base(pod), claims, frozenset()).gpus[0].core_pct == 5


@pytest.mark.parametrize(("capacity", "count", "words"), [
    ({"memory": "1Gi", "cores": "150"}, None, "cores must be 1..100"),
    ({"memory": "lots", "cores": "5"}, None, "capacity memory"),
    ({}, 0, "count must be"),
])
def test_an_absurd_claim_is_refused_naming_the_claim_and_request(
        capacity: dict[str, str], count: int | None, words: str) -> None:
    pod = claim_pod("p", ("gpu", "c"))
    claims = claims_of(claim("c", [ask(count=count, **capacity)]))
    with pytest.raises(InvalidInput, match=f"ResourceClaim {NS}/c request gpu: .*{words}"):
        claims_request(pod, base(pod), claims, frozenset())


# -- prioritize -----------------------------------------------------------------------------
def cluster() -> ClusterCache:
    """Two DRA nodes (d0, d1) and a device-plugin node (plain), 2 x 80 GiB GPUs each."""
    cache = ClusterCache(decisions=DecisionCheck(local_keys()))
    cache.sync_nodes([Node.from_dict(node_obj("d0", labels=MODE)),
                      Node.from_dict(node_obj("d1", labels=MODE)),
                      Node.from_dict(node_obj("plain"))])
    cache.sync_devices([gpu_obj(n, j, memory_mib=81920) for n in ("d0", "d1", "plain")
                        for j in range(2)])
    return cache


def scores(ext: Extender, pod: dict[str, Any], nodes: list[str]) -> dict[str, int]:
    answer = ext.prioritize({"Pod": pod, "NodeNames": nodes})
    return {h["Host"]: h["Score"] for h in answer.items()}


def test_prioritize_packs_a_dra_slice_next_to_the_claims_already_on_a_gpu() -> None:
    cache = cluster()
    with cache.lock:
        cache.dra.sync_claims(cache, [
            claim("held", [ask(memory="40Gi", cores="50")],
                  allocated_on=("d1", 1, {"memory": "40Gi", "cores": "50"})),
            claim("new", [ask(memory="20Gi", cores="30")])])
    ext = Extender(cache, Settings("best-fit"), Metrics())
    got = scores(ext, claim_pod("p", ("gpu", "new")), ["d0", "d1", "plain"])
    assert got.get("d1") == 10  # the fullest GPU that still has room: best fit
    assert "plain" not in got  # a device-plugin node cannot serve a claim
    assert got.get("d0", 0) < 10


def test_prioritize_scores_only_the_dra_nodes_where_the_claim_fits() -> None:
    cache = cluster()
    with cache.lock:
        cache.dra.sync_claims(cache, [
            claim("w0", [ask("a")], allocated_on=("d0", 0, None)),
            claim("w1", [ask("a")], allocated_on=("d0", 1, None)),
            claim("two", [ask(count=2)])])
    ext = Extender(cache, Settings("best-fit"), Metrics())
    got = scores(ext, claim_pod("p", ("gpu", "two")), ["d0", "d1", "plain"])
    assert set(got) == {"d1"}  # d0's GPUs are held whole by two claims


def test_prioritize_has_nothing_to_say_without_claims_to_place() -> None:
    cache = cluster()
    with cache.lock:
        cache.dra.sync_claims(cache, [claim("done", [ask()], allocated_on=("d0", 0, None))])
    ext = Extender(cache, Settings("best-fit"), Metrics())
    assert scores(ext, claim_pod("p", ("gpu", "done")), ["d0", "d1"]) == {}
    assert scores(ext, claim_pod("q", ("gpu", "missing")), ["d0", "d1"]) == {}
    plain = pod_obj("cpu-only")
    assert scores(ext, plain, ["d0", "d1", "plain"]) == {}


def test_prioritize_of_a_broken_claim_answers_empty_and_counts_an_error() -> None:
    cache = cluster()
    with cache.lock:
        cache.dra.sync_claims(cache, [claim("bad", [ask(memory="1Gi", cores="900")])])
    ext = Extender(cache, Settings("best-fit"), Metrics())
    assert scores(ext, claim_pod("p", ("gpu", "bad")), ["d0", "d1"]) == {}
    errors = ext.metrics.decisions.labels("prioritize", "error")._value.get()
    assert errors == 1


def test_a_claim_in_another_namespace_is_not_the_pods() -> None:
    cache = cluster()
    other = claim("c", [ask()])
    other["metadata"]["namespace"] = "team-b"
    with cache.lock:
        cache.dra.sync_claims(cache, [other])
    ext = Extender(cache, Settings("best-fit"), Metrics())
    assert scores(ext, claim_pod("p", ("gpu", "c")), ["d0", "d1"]) == {}


def test_the_scored_request_is_the_core_policys_the_same_as_the_device_plugin_path() -> None:
    """The same shape asked through the device plugin on a device-plugin twin of the
    cluster gets the same ranking: one policy, one scoring implementation."""
    cache = cluster()
    held = claim("held", [ask(memory="40Gi", cores="50")],
                 allocated_on=("d1", 1, {"memory": "40Gi", "cores": "50"}))
    with cache.lock:
        cache.dra.sync_claims(cache, [held, claim("new", [ask(memory="20Gi", cores="30")])])
    ext = Extender(cache, Settings("fgd-balance"), Metrics())
    dra_scores = scores(ext, claim_pod("p", ("gpu", "new")), ["d0", "d1"])
    twin = ClusterCache(decisions=DecisionCheck(local_keys()))
    twin.sync_nodes([Node.from_dict(node_obj(n)) for n in ("d0", "d1")])
    twin.sync_devices([gpu_obj(n, j, memory_mib=81920) for n in ("d0", "d1") for j in range(2)])
    with twin.lock:
        alloc = copy.deepcopy(cache.state.allocations[dra.claim_key("uid-held")])
        twin.hold(alloc, "claim")
    twin_ext = Extender(twin, Settings("fgd-balance"), Metrics())
    pod = pod_obj("p", {"gpupool.io/gpu-memory": "20480", "gpupool.io/gpu-core": "30"}, ns=NS)
    pod["metadata"]["uid"] = "uid-p"
    assert scores(twin_ext, pod, ["d0", "d1"]) == dra_scores


def test_the_prioritize_claims_verb_scores_claim_pods_only_so_no_pod_is_scored_twice() -> None:
    cache = cluster()
    with cache.lock:
        cache.dra.sync_claims(cache, [
            claim("held", [ask(memory="40Gi", cores="50")],
                  allocated_on=("d1", 1, {"memory": "40Gi", "cores": "50"})),
            claim("new", [ask(memory="20Gi", cores="30")])])
    ext = Extender(cache, Settings("best-fit"), Metrics())
    verb = verb_handlers(ext)["prioritize-claims"]
    body = msgspec.json.encode({"Pod": claim_pod("p", ("gpu", "new")),
                                "NodeNames": ["d0", "d1", "plain"]})
    assert {h["Host"]: h["Score"] for h in msgspec.json.decode(verb(body))}["d1"] == 10
    plugin_pod = pod_obj("q", {"gpupool.io/gpu-memory": "1024"}, ns=NS)
    plugin_pod["metadata"]["uid"] = "uid-q"
    plugin = msgspec.json.encode({"Pod": plugin_pod, "NodeNames": ["plain"]})
    assert msgspec.json.decode(verb(plugin)) == []  # the main entry's prioritize scores it
    assert msgspec.json.decode(verb(b"{not json")) == []


def test_the_scheduler_entry_docs_dra_shows_calls_a_verb_the_extender_serves() -> None:
    """docs/dra.md's extender entries: the DRA entry filters (tenancy) and prioritizes with
    verbs the app serves, for every pod (no managedResources), blocking as the main one."""
    docs = (Path(__file__).resolve().parents[2] / "docs" / "dra.md").read_text()
    block = docs.split("```yaml\nextenders:", 1)[1].split("```", 1)[0]
    main, claims = yaml.safe_load("extenders:" + block)["extenders"]
    assert claims["prioritizeVerb"] == "prioritize-claims"
    assert claims["filterVerb"] == "filter-claims"
    assert {f"/{claims['prioritizeVerb']}", f"/{claims['filterVerb']}"} <= build_verbs(
        Extender(cluster(), Settings("best-fit"), Metrics())).paths()
    assert not {"bindVerb", "preemptVerb", "managedResources"} & set(claims)
    assert claims["ignorable"] is False and claims["nodeCacheCapable"] is True
    assert claims["weight"] == main["weight"] == 5
    assert claims["urlPrefix"] == main["urlPrefix"]
