"""filter-claims charges, on each sent node, the most the pod's claims could take there:
allocationMode All as every device it selects on the node, firstAvailable as its largest
alternative that could be allocated there, each request to its own ResourceClass; and an
allocated claim is charged what its allocation holds."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pytest

from gpupool.contract import dra
from gpupool.core.classes import ResourceClass
from gpupool.core.permissions import Permission
from gpupool.core.quota import Limit
from gpupool.core.selector import Selector
from gpupool.core.tenants import TenantBook, TenantQuota
from gpupool.extender.dra.draquota import _unique_rows
from gpupool.extender.edge.app import verb_handlers
from gpupool.extender.metrics import Metrics
from gpupool.extender.service import Extender, Settings
from gpupool.extender.state.cache import ClusterCache
from tests.go_format import sprintf

from .test_dra_prioritize import NS, ask, claim, claim_pod
from .test_dra_selectors import H100, cluster, with_selectors

WHOLE_MIB = 81920  # the test GPUs' memory (whole memory units)


def tenant(limit: Limit, classes: tuple[tuple[str, Limit], ...] = ()) -> TenantBook:
    return TenantBook([TenantQuota("team", frozenset({NS}), limit, classes)])


def filtered(cache: ClusterCache, pod: dict[str, Any], nodes: list[str]) -> dict[str, Any]:
    ext = Extender(cache, Settings("best-fit"), Metrics())
    body = msgspec.json.encode({"Pod": pod, "NodeNames": nodes})
    answer: dict[str, Any] = msgspec.json.decode(verb_handlers(ext)["filter-claims"](body))
    return answer


def allocated(name: str, node: str, results: list[tuple[str, int, dict[str, str] | None]],
              requests: list[dict[str, Any]]) -> dict[str, Any]:
    """A claim allocated as kube-scheduler writes it (the recorded v1 shape): per result
    (request name, device index, consumedCapacity or None)."""
    obj = claim(name, requests)
    out = []
    for request, index, consumed in results:
        result: dict[str, Any] = {"driver": dra.DRIVER, "pool": node, "device": f"gpu-{index}",
                                  "request": request}
        if consumed:
            result["consumedCapacity"] = consumed
            result["shareID"] = f"share-{name}-{index}"
        out.append(result)
    obj["status"] = {"allocation": {"devices": {"results": out}, "nodeSelector": {
        "nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}
    return obj


def every_h100() -> dict[str, Any]:
    request = with_selectors(ask(), H100)
    request["exactly"]["allocationMode"] = "All"
    return request


def used_elsewhere(gpus: int) -> list[dict[str, Any]]:
    """Claims of the tenant holding ``gpus`` whole GPUs on node ``spare``."""
    return [allocated(f"held{j}", "spare", [("gpu", j, None)], [ask()]) for j in range(gpus)]


@pytest.mark.parametrize(("limit", "used", "passed", "waits", "never"), [
    (None, 0, ["eight", "one"], [], []),
    (2, 0, ["one"], [], ["eight"]),
    (1, 0, ["one"], [], ["eight"]),
    (8, 8, [], ["one", "eight"], []),
    (8, 7, ["one"], ["eight"], []),
    (9, 1, ["eight", "one"], [], []),
    (9, 2, ["one"], ["eight"], []),
], ids=["no quota: both nodes", "8 GPUs above a limit of 2: never on eight, one fits",
        "the one GPU takes the tenant exactly to its limit",
        "a tenant at its limit waits on both", "one GPU below its limit: only one",
        "8 more takes it exactly to 9", "one over: waits on eight, one still fits"])
def test_allocation_mode_all_is_charged_every_device_it_selects_on_the_node(
        limit: int | None, used: int, passed: list[str], waits: list[str], never: list[str]
) -> None:
    cache = cluster({"eight": ("H100",) * 8, "one": ("H100", "A100"), "spare": ("A100",) * 8})
    if limit is not None:
        cache.catalogue.tenants = tenant(Limit(gpus=limit))
    with cache.lock:
        cache.dra.sync_claims(cache, [*used_elsewhere(used), claim("all", [every_h100()])])
    answer = filtered(cache, claim_pod("p", ("gpu", "all")), ["eight", "one"])
    assert answer["NodeNames"] == passed
    assert sorted(answer["FailedNodes"]) == sorted(waits)
    assert sorted(answer["FailedAndUnresolvableNodes"]) == sorted(never)
    if "eight" in never:
        assert answer["FailedAndUnresolvableNodes"]["eight"] == (
            f"gpupool: quota of tenant team exceeded: 8 GPUs asked, 0 of {limit} in use, "
            f"{limit} left")


def test_all_of_whole_gpus_is_charged_their_whole_memory_and_compute() -> None:
    cache = cluster({"eight": ("H100",) * 8, "one": ("H100", "A100")})
    cache.catalogue.tenants = tenant(Limit(memory_mib=2 * WHOLE_MIB, core_pct=200))
    with cache.lock:
        cache.dra.sync_claims(cache, [claim("all", [every_h100()])])
    answer = filtered(cache, claim_pod("p", ("gpu", "all")), ["eight", "one"])
    assert answer["NodeNames"] == ["one"]
    why = answer["FailedAndUnresolvableNodes"]["eight"]
    assert f"{8 * WHOLE_MIB} MiB of GPU memory asked, 0 of {2 * WHOLE_MIB} in use" in why


def first_available(*alternatives: dict[str, Any]) -> dict[str, Any]:
    return {"name": "gpu", "firstAvailable": list(alternatives)}


SMALL = {"name": "small", "deviceClassName": dra.DRIVER,
         "capacity": {"requests": {"memory": "10Gi", "cores": "10"}}}
TWO_H100 = {"name": "big", "deviceClassName": dra.DRIVER, "count": 2,
            "selectors": [{"cel": {"expression": H100}}]}


@pytest.mark.parametrize(("alternatives", "limit", "passed", "refused"), [
    ((SMALL, TWO_H100), Limit(gpus=1), ["a"], {"h": "2 GPUs asked, 0 of 1 in use"}),
    ((SMALL, TWO_H100), Limit(memory_mib=20480), ["a"],
     {"h": f"{2 * WHOLE_MIB} MiB of GPU memory asked, 0 of 20480 in use"}),
    ((SMALL, TWO_H100), Limit(gpus=2), ["a", "h"], {}),
    ((TWO_H100, SMALL), Limit(gpus=1), ["a"], {"h": "2 GPUs asked, 0 of 1 in use"}),
    ((SMALL,), Limit(gpus=1), ["a", "h"], {}),
], ids=["a larger second choice is refused where it could be allocated",
        "its whole memory counts against a memory limit",
        "both choices fit the quota: every node",
        "the order does not matter: the largest possible is charged",
        "a single small choice fits everywhere"])
def test_first_available_is_charged_its_largest_alternative_that_could_be_allocated(
        alternatives: tuple[dict[str, Any], ...], limit: Limit, passed: list[str],
        refused: dict[str, str]) -> None:
    cache = cluster({"a": ("A100", "A100"), "h": ("H100", "H100")})
    cache.catalogue.tenants = tenant(limit)
    with cache.lock:
        cache.dra.sync_claims(cache, [claim("c", [first_available(*alternatives)])])
    answer = filtered(cache, claim_pod("p", ("gpu", "c")), ["a", "h"])
    assert answer["NodeNames"] == passed
    assert set(answer["FailedAndUnresolvableNodes"]) == set(refused)
    for node, sentence in refused.items():
        assert sentence in answer["FailedAndUnresolvableNodes"][node]


def two_classes(cache: ClusterCache) -> None:
    for name, model in (("a100s", "A100"), ("h100s", "H100")):
        cache.catalogue.classes.put(ResourceClass(name, Selector.from_spec(
            {"matchLabels": {"gpupool.io/model": model}})))


@pytest.mark.parametrize(("held", "passed", "reason"), [
    ([], ["mix"], None),
    ([("hx", "h100s", 1)], [], "quota of tenant team for class h100s exceeded: 1 GPUs asked, "
                                "1 of 1 in use, 0 left"),
    ([("ax", "a100s", 0)], [], "quota of tenant team for class a100s exceeded: 1 GPUs asked, "
                               "1 of 1 in use, 0 left"),
], ids=["one GPU of each class fits one of each class limit",
        "the H100 class is full: refused naming it", "the A100 class is full: refused naming it"])
def test_requests_of_two_classes_are_each_charged_to_their_own_class(
        held: list[tuple[str, str, int]], passed: list[str], reason: str | None) -> None:
    cache = cluster({"mix": ("A100", "H100"), "spare": ("A100", "H100")})
    two_classes(cache)
    one = Limit(gpus=1)
    cache.catalogue.tenants = tenant(Limit(gpus=3), (("a100s", one), ("h100s", one)))
    both = claim("both", [ask("x", device_class="a100s.gpupool.io"),
                          ask("y", device_class="h100s.gpupool.io")])
    holding = [allocated(name, "spare", [("gpu", index, None)],
                         [ask(device_class=f"{cls}.gpupool.io")]) for name, cls, index in held]
    with cache.lock:
        cache.dra.sync_claims(cache, [*holding, both])
    answer = filtered(cache, claim_pod("p", ("gpu", "both")), ["mix"])
    assert answer["NodeNames"] == passed
    if reason is not None:
        assert answer["FailedNodes"]["mix"] == "gpupool: " + reason


def test_the_tenant_total_of_several_classes_is_checked_against_the_tenant_limit() -> None:
    cache = cluster({"mix": ("A100", "H100")})
    two_classes(cache)
    cache.catalogue.tenants = tenant(Limit(gpus=1))
    with cache.lock:
        cache.dra.sync_claims(cache, [claim("both", [
            ask("x", device_class="a100s.gpupool.io"),
            ask("y", device_class="h100s.gpupool.io")])])
    answer = filtered(cache, claim_pod("p", ("gpu", "both")), ["mix"])
    assert answer["FailedAndUnresolvableNodes"]["mix"] == (
        "gpupool: quota of tenant team exceeded: 2 GPUs asked, 0 of 1 in use, 1 left")


def test_a_compute_quota_refusal_survives_kube_schedulers_go_formatting() -> None:
    cache = cluster({"eight": ("H100",) * 8})
    cache.catalogue.tenants = tenant(Limit(core_pct=150))
    with cache.lock:
        cache.dra.sync_claims(cache, [claim("all", [every_h100()])])
    why = filtered(cache, claim_pod("p", ("gpu", "all")),
                   ["eight"])["FailedAndUnresolvableNodes"]["eight"]
    assert sprintf(why) == why  # Go's Sprintf shows it as sent
    assert why == ("gpupool: quota of tenant team exceeded: 800 percent of GPU compute "
                   "asked, 0 of 150 in use, 150 left")


MALFORMED: list[dict[str, Any]] = [
    {"name": "gpu", "firstAvailable": "not a list"},
    {"name": "gpu", "firstAvailable": [None, 3, {"deviceClassName": 7}]},
    {"name": "gpu", "firstAvailable": []},
    {"name": "gpu", "exactly": {"deviceClassName": dra.DRIVER, "allocationMode": "All",
                                "count": 500}},
    {"name": "gpu", "exactly": {"deviceClassName": dra.DRIVER, "allocationMode": "Most"}},
    {"name": "gpu", "exactly": {"deviceClassName": dra.DRIVER, "allocationMode": "All",
                                "selectors": [{"cel": {"expression": "device.x =="}}]}},
    {"name": "gpu", "exactly": {"deviceClassName": "nope.gpupool.io", "allocationMode": "All"}},
    {"name": "gpu", "exactly": {"deviceClassName": dra.DRIVER, "count": -1}},
    {"name": "gpu", "exactly": {"deviceClassName": dra.DRIVER,
                                "capacity": {"requests": {"memory": "lots", "cores": "x"}}}},
    {"exactly": {"deviceClassName": dra.DRIVER, "allocationMode": "All",
                 "capacity": {"requests": {"memory": "1Ti"}}}},
]


@pytest.mark.parametrize("request_", MALFORMED, ids=[
    "firstAvailable not a list", "firstAvailable of junk", "firstAvailable empty",
    "All with an absurd count", "an unknown allocation mode", "All with a broken selector",
    "All of an unknown class", "a negative count", "unreadable capacity",
    "All of more memory than any GPU, without a name"])
def test_malformed_claims_under_quota_never_crash_filter_claims(
        request_: dict[str, Any]) -> None:
    cache = cluster({"h": ("H100", "H100")})
    cache.catalogue.tenants = tenant(Limit(gpus=1))
    with cache.lock:
        cache.dra.sync_claims(cache, [claim("bad", [request_])])
    answer = filtered(cache, claim_pod("p", ("gpu", "bad")), ["h", "gone"])
    assert set(answer) >= {"NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    if answer["Error"]:
        assert "bad" in answer["Error"]  # names the claim
    else:
        decided = {*answer["NodeNames"], *answer["FailedNodes"],
                   *answer["FailedAndUnresolvableNodes"]}
        assert decided == {"h", "gone"}


def test_an_allocated_all_claim_is_charged_every_device_it_was_given_whole() -> None:
    cache = cluster({"h": ("H100",) * 4})
    every = every_h100()
    held = allocated("all", "h", [("gpu", j, None) for j in range(4)], [every])
    with cache.lock:
        cache.dra.sync_claims(cache, [held])
    used = cache.catalogue.quotas.used_by_tenant(NS)
    assert (used.gpus, used.memory_mib, used.core_pct) == (4, 4 * WHOLE_MIB, 400)


@pytest.mark.parametrize(("given", "consumed", "expected", "cls"), [
    ("gpu/small", {"memory": "10Gi", "cores": "10"}, (1, 10240, 10), "small"),
    ("gpu/big", None, (1, WHOLE_MIB, 100), "big"),
], ids=["the small alternative given: its slice, to its class",
        "the big alternative given: a whole GPU, to its class"])
def test_an_allocated_first_available_claim_is_charged_the_alternative_it_was_given(
        given: str, consumed: dict[str, str] | None, expected: tuple[int, int, int],
        cls: str) -> None:
    cache = cluster({"h": ("H100", "H100")})
    for name in ("small", "big"):
        cache.catalogue.classes.put(ResourceClass(name))
    big = {"name": "big", "deviceClassName": "big.gpupool.io"}
    small = {**SMALL, "deviceClassName": "small.gpupool.io"}
    held = allocated("fa", "h", [(given, 0, consumed)], [first_available(big, small)])
    with cache.lock:
        cache.dra.sync_claims(cache, [held])
    book = cache.catalogue.quotas
    used = book.used_by_tenant(NS)
    assert (used.gpus, used.memory_mib, used.core_pct) == expected
    assert book.used_by_class(NS, cls) == used


@pytest.mark.parametrize(("selectors", "passed"), [
    ((), ["a"]),
    ((H100,), []),
    (("device.attributes['gpu.gpupool.io'].model == 'A100'",), ["mixed", "a"]),
], ids=["every GPU: refused where one is not permitted",
        "only H100s: mixed's is not permitted, a has none permitted and selected",
        "only the permitted A100s: both nodes"])
def test_all_is_refused_where_it_would_take_a_gpu_outside_the_tenants_permission(
        selectors: tuple[str, ...], passed: list[str]) -> None:
    cache = cluster({"mixed": ("A100", "H100"), "a": ("A100", "A100")})
    a100 = Selector.from_spec({"matchLabels": {"gpupool.io/model": "A100"}})
    cache.catalogue.permissions.put(Permission("a100-only", frozenset({NS}), gpus=a100))
    request = with_selectors(ask(), *selectors)
    request["exactly"]["allocationMode"] = "All"
    with cache.lock:
        cache.dra.sync_claims(cache, [claim("all", [request])])
    answer = filtered(cache, claim_pod("p", ("gpu", "all")), ["mixed", "a"])
    assert answer["NodeNames"] == passed
    for node, why in answer["FailedAndUnresolvableNodes"].items():
        assert node not in passed and "GPUPermission a100-only" in why, why
    assert len(answer["NodeNames"]) + len(answer["FailedAndUnresolvableNodes"]) == 2


@pytest.mark.parametrize("table", [
    np.array([[1, 2, 3], [4, 5, 6], [1, 2, 3], [0, 0, 0]]),
    np.array([[0, 1_000_003], [1, 0], [0, 1_000_003]]),  # the same 1-D key: checked
    np.random.default_rng(7).integers(0, 3, (500, 6)),
], ids=["a few rows", "two rows of one key are told apart", "many random rows"])
def test_node_charges_are_grouped_exactly_as_rows(table: np.ndarray) -> None:
    rows_of, which = _unique_rows(table.astype(np.int64))
    assert np.array_equal(rows_of[which], table)
    assert len(rows_of) == len({tuple(r) for r in table.tolist()})
