"""prioritize-claims reads what kube-scheduler's allocator reads: a claim's CEL selectors
(over the devices its ResourceSlices publish), allocationMode All, firstAvailable in order
and matchAttribute constraints; a broken selector never crashes the verb."""

from __future__ import annotations

import logging
from typing import Any

import msgspec
import numpy as np
import pytest
from lightkube.resources.core_v1 import Node

from gpupool.contract import dra
from gpupool.core.classes import ResourceClass
from gpupool.core.permissions import Permission
from gpupool.core.request import PodRequest
from gpupool.core.selector import Selector
from gpupool.extender.dra.draasks import claim_asks
from gpupool.extender.dra.drascores import device_masks
from gpupool.extender.dra.draselect import fitting
from gpupool.extender.edge.app import verb_handlers
from gpupool.extender.metrics import Metrics
from gpupool.extender.service import Extender, Settings
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.state.signatures import DecisionCheck

from .builders import gpu_obj, local_keys, node_obj
from .test_dra_prioritize import ask, claim, claim_pod

MODE = {dra.NODE_MODE_LABEL: dra.MODE_DRA}
H100 = "device.attributes['gpu.gpupool.io'].model == 'H100'"


def device(node: str, j: int, model: str, numa: int = 0, **extra: dict[str, Any]
           ) -> dict[str, Any]:
    attrs = {"model": {"string": model}, "uuid": {"string": f"GPU-{node}-{j}"},
             "index": {"int": j}, "numaNode": {"int": numa}, **extra}
    return {"name": f"gpu-{j}", "allowMultipleAllocations": True, "attributes": attrs,
            "capacity": {"memory": {"value": "80Gi"}, "cores": {"value": "100"}}}


def slice_of(node: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": dra.slice_name(node)},
            "spec": {"driver": dra.DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": devices}}


def cluster(models: dict[str, tuple[str, ...]], slices: list[dict[str, Any]] | None = None
            ) -> ClusterCache:
    """DRA nodes with 80 GiB GPUs of the given models (GPUDevices), and ``slices``."""
    cache = ClusterCache(decisions=DecisionCheck(local_keys()))
    cache.sync_nodes([Node.from_dict(node_obj(n, labels=MODE)) for n in models])
    cache.sync_devices([gpu_obj(n, j, model=m, memory_mib=81920)
                        for n, ms in models.items() for j, m in enumerate(ms)])
    with cache.lock:
        cache.dra.sync_slices(cache, slices if slices is not None else [
            slice_of(n, [device(n, j, m) for j, m in enumerate(ms)])
            for n, ms in models.items()])
    return cache


def scores(cache: ClusterCache, pod: dict[str, Any], nodes: list[str],
           policy: str = "best-fit") -> dict[str, int]:
    ext = Extender(cache, Settings(policy), Metrics())
    body = msgspec.json.encode({"Pod": pod, "NodeNames": nodes})
    return {h["Host"]: h["Score"] for h in
            msgspec.json.decode(verb_handlers(ext)["prioritize-claims"](body))}


def fits(cache: ClusterCache, pod: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Node -> the GPU counts of the demands it would be scored with (where the claims
    fit, however low the node then scores)."""
    base = PodRequest(pod["metadata"]["uid"], 1000, 1024, tenant="team-a")
    with cache.lock:
        state = cache.state
        classes = frozenset(cache.catalogue.classes.names())
        groups = fitting(state, claim_asks(pod, base, cache.dra, classes), base,
                         device_masks(cache.dra), cache.dra, cache.catalogue.classes,
                         cache.modes.dra_mask(state))
        return {state.nodes[int(i)].name: tuple(d.count for d in g.request.gpus)
                for g in groups for i in np.flatnonzero(g.nodes)}


def held(name: str, node: str, j: int) -> dict[str, Any]:
    return claim(name, [ask(memory="40Gi", cores="50")],
                 allocated_on=(node, j, {"memory": "40Gi", "cores": "50"}))


def with_selectors(request: dict[str, Any], *expressions: str) -> dict[str, Any]:
    request["exactly"]["selectors"] = [{"cel": {"expression": e}} for e in expressions]
    return request


def test_a_model_selector_keeps_the_claim_off_a_node_of_another_model_that_packs_better(
        ) -> None:
    cache = cluster({"a": ("A100", "A100"), "h": ("H100", "H100")})
    plain = claim("plain", [ask(memory="20Gi", cores="30")])
    picky = claim("picky", [with_selectors(ask(memory="20Gi", cores="30"), H100)])
    with cache.lock:
        cache.dra.sync_claims(cache, [held("busy", "a", 1), plain, picky])
    assert scores(cache, claim_pod("p", ("gpu", "plain")), ["a", "h"])["a"] == 10
    assert set(scores(cache, claim_pod("q", ("gpu", "picky")), ["a", "h"])) == {"h"}


def test_selectors_read_every_attribute_the_slice_publishes_versions_and_capacity() -> None:
    new = {"driverVersion": {"version": "570.86.10"}}
    old = {"driverVersion": {"version": "535.161.8"}}
    cache = cluster({"x": ("A100",), "y": ("A100",)}, [
        slice_of("x", [device("x", 0, "A100", **old)]),
        slice_of("y", [device("y", 0, "A100", **new)])])
    expression = ("device.attributes['gpu.gpupool.io'].driverVersion.isGreaterThan("
                  "semver('550.0.0')) && device.capacity['gpu.gpupool.io'].memory"
                  ".compareTo(quantity('40Gi')) > 0")
    with cache.lock:
        cache.dra.sync_claims(cache, [claim("c", [with_selectors(ask(), expression)])])
    assert set(scores(cache, claim_pod("p", ("gpu", "c")), ["x", "y"])) == {"y"}


def test_a_gpu_no_slice_lists_yet_is_read_from_its_gpudevice() -> None:
    cache = cluster({"a": ("A100",), "h": ("H100",)}, slices=[])
    with cache.lock:
        cache.dra.sync_claims(cache, [claim("c", [with_selectors(ask(), H100)])])
    assert set(scores(cache, claim_pod("p", ("gpu", "c")), ["a", "h"])) == {"h"}


def test_allocation_mode_all_needs_every_selected_device_of_the_node_whole() -> None:
    cache = cluster({"free": ("H100", "H100", "A100"), "used": ("H100", "H100"),
                     "none": ("A100", "A100"), "one": ("H100", "A100")})
    every = with_selectors(ask(), H100)
    every["exactly"]["allocationMode"] = "All"
    with cache.lock:
        cache.dra.sync_claims(cache, [held("busy", "used", 1), claim("all", [every])])
    pod = claim_pod("p", ("gpu", "all"))
    # "used": one H100 is shared; "none": no H100 at all; the count is the node's
    assert fits(cache, pod) == {"free": (2,), "one": (1,)}
    assert set(scores(cache, pod, ["free", "used", "none", "one"])) <= {"free", "one"}


def test_first_available_takes_the_first_alternative_that_fits_on_each_node() -> None:
    cache = cluster({"a": ("A100", "A100"), "h": ("H100", "H100")})
    two_h100 = {"name": "big", "deviceClassName": dra.DRIVER, "count": 2,
                "selectors": [{"cel": {"expression": H100}}]}
    small = {"name": "small", "deviceClassName": dra.DRIVER,
             "capacity": {"requests": {"memory": "10Gi", "cores": "10"}}}
    first = claim("first", [{"name": "gpu", "firstAvailable": [two_h100, small]}])
    only_big = claim("onlybig", [{"name": "gpu", "firstAvailable": [two_h100]}])
    with cache.lock:
        cache.dra.sync_claims(cache, [first, only_big])
    p, q = claim_pod("p", ("gpu", "first")), claim_pod("q", ("gpu", "onlybig"))
    assert fits(cache, p) == {"h": (2,), "a": (1,)}  # two whole H100s on h, a slice on a
    assert fits(cache, q) == {"h": (2,)}
    with cache.lock:
        cache.dra.claim_event(cache, "ADDED", held("busy", "h", 0))
    # h's H100s are no longer both whole: only the small alternative is left there
    assert fits(cache, q) == {}
    assert scores(cache, q, ["a", "h"]) == {}
    assert fits(cache, p) == {"h": (1,), "a": (1,)}


def test_match_attribute_keeps_a_claims_devices_on_one_numa_node() -> None:
    cache = cluster({"split": ("A100", "A100"), "same": ("A100", "A100")}, [
        slice_of("split", [device("split", 0, "A100", numa=0),
                           device("split", 1, "A100", numa=1)]),
        slice_of("same", [device("same", 0, "A100", numa=1),
                          device("same", 1, "A100", numa=1)])])
    two = claim("two", [ask("x"), ask("y")])
    tied = claim("tied", [ask("x"), ask("y")])
    tied["spec"]["devices"]["constraints"] = [
        {"requests": ["x", "y"], "matchAttribute": "gpu.gpupool.io/numaNode"}]
    with cache.lock:
        cache.dra.sync_claims(cache, [two, tied])
    assert set(fits(cache, claim_pod("p", ("gpu", "two")))) == {"split", "same"}
    assert set(fits(cache, claim_pod("q", ("gpu", "tied")))) == {"same"}
    assert set(scores(cache, claim_pod("q", ("gpu", "tied")), ["split", "same"])) <= {"same"}


@pytest.mark.parametrize(("expression", "words"), [
    ("device.attributes['gpu.gpupool.io'].model ==", "does not compile"),
    ("device.attributes['gpu.gpupool.io'].missing == 'x'", "runtime error"),
    ("quantity('many') == quantity('1')", "runtime error"),
    ("device.attributes['gpu.gpupool.io'].model", "must evaluate to bool"),
], ids=["syntax error", "a missing attribute read", "a bad quantity", "not a bool"])
def test_a_broken_selector_matches_nothing_never_crashes_and_is_logged_once_naming_the_claim(
        expression: str, words: str, caplog: pytest.LogCaptureFixture) -> None:
    cache = cluster({"a": ("A100",), "h": ("H100",)})
    with cache.lock:
        cache.dra.sync_claims(cache, [claim("bad", [with_selectors(ask(), expression)])])
    caplog.set_level(logging.WARNING, "gpupool.extender.dra.draselect")
    for _ in range(3):
        assert scores(cache, claim_pod("p", ("gpu", "bad")), ["a", "h"]) == {}
    logged = [r.getMessage() for r in caplog.records if "team-a/bad" in r.getMessage()]
    assert len(logged) == 1 and words in logged[0]
    assert words in device_masks(cache.dra).problems["team-a/bad"]


def test_a_selector_is_evaluated_once_per_kind_of_device_not_once_per_gpu() -> None:
    models = {f"n{i}": ("A100", "H100", "T4", "A100") for i in range(50)}
    cache = cluster(models)
    with cache.lock:
        cache.dra.sync_claims(cache, [claim("c", [with_selectors(ask(), H100)])])
    scores(cache, claim_pod("p", ("gpu", "c")), sorted(models))
    assert set(fits(cache, claim_pod("p", ("gpu", "c")))) == set(models)  # each has an H100
    evaluations = device_masks(cache.dra).selectors.evaluations
    assert evaluations <= 3  # one per model's reading, not one per each of the 200 GPUs
    scores(cache, claim_pod("p", ("gpu", "c")), sorted(models))
    assert device_masks(cache.dra).selectors.evaluations == evaluations  # the mask is kept


def test_filter_claims_counts_only_the_permitted_gpus_the_claims_selectors_select() -> None:
    """A tenant permitted only A100s whose claim selects H100s would be given an H100 by
    the allocator: nodes where it selects an unpermitted GPU are refused, naming the
    permission (an unselective claim too, on the node with an H100)."""
    cache = cluster({"mixed": ("A100", "H100"), "h": ("H100", "H100")})
    a100 = Selector.from_spec({"matchLabels": {"gpupool.io/model": "A100"}})
    cache.catalogue.permissions.put(Permission("a100-only", frozenset({"team-a"}), gpus=a100))
    with cache.lock:
        cache.dra.sync_claims(cache, [claim("picky", [with_selectors(ask(), H100)]),
                                      claim("any", [ask()])])
    ext = Extender(cache, Settings("best-fit"), Metrics())

    def filtered(pod: dict[str, Any]) -> dict[str, Any]:
        body = msgspec.json.encode({"Pod": pod, "NodeNames": ["mixed", "h"]})
        answer: dict[str, Any] = msgspec.json.decode(verb_handlers(ext)["filter-claims"](body))
        return answer

    unselective = filtered(claim_pod("p", ("gpu", "any")))
    assert unselective["NodeNames"] == []
    assert "a100-only" in unselective["FailedAndUnresolvableNodes"]["mixed"]
    picky = filtered(claim_pod("q", ("gpu", "picky")))
    assert picky["NodeNames"] == []
    assert "a100-only" in picky["FailedAndUnresolvableNodes"]["mixed"]


def test_filter_claims_of_a_broken_selector_passes_what_tenancy_passes() -> None:
    cache = cluster({"a": ("A100",)})
    with cache.lock:
        cache.dra.sync_claims(cache, [claim("bad", [with_selectors(ask(), "device.x ==")])])
    ext = Extender(cache, Settings("best-fit"), Metrics())
    body = msgspec.json.encode({"Pod": claim_pod("p", ("gpu", "bad")), "NodeNames": ["a"]})
    answer = msgspec.json.decode(verb_handlers(ext)["filter-claims"](body))
    assert answer["NodeNames"] == ["a"] and not answer.get("Error")


def test_a_claim_of_many_selective_requests_is_grouped_and_scored() -> None:
    cache = cluster({"a": ("A100",) * 8, "h": ("H100",) * 8})
    requests = [with_selectors(ask(f"r{k}"), H100) for k in range(7)]
    with cache.lock:
        cache.dra.sync_claims(cache, [claim("many", requests)])
    pod = claim_pod("p", ("gpu", "many"))
    assert fits(cache, pod) == {"h": (1,) * 7}
    assert set(scores(cache, pod, ["a", "h"])) <= {"h"}


def test_requests_of_two_resource_classes_are_each_scored_on_their_own_class() -> None:
    cache = cluster({"a": ("A100", "A100"), "h": ("H100", "H100"), "mix": ("A100", "H100")})
    for name, model in (("a100s", "A100"), ("h100s", "H100")):
        cache.catalogue.classes.put(ResourceClass(name, Selector.from_spec(
            {"matchLabels": {"gpupool.io/model": model}})))
    both = claim("both", [ask("x", device_class="a100s.gpupool.io"),
                          ask("y", device_class="h100s.gpupool.io")])
    with cache.lock:
        cache.dra.sync_claims(cache, [both])
    assert set(fits(cache, claim_pod("p", ("gpu", "both")))) == {"mix"}
