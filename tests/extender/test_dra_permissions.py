"""filter-claims fails closed on GPUPermissions: kube-scheduler's allocator may take any
device a claim selects, so a confined tenant is refused every node where its claims (any
firstAvailable alternative) select a GPU the permission does not permit; nodes where every
selected GPU is permitted, and tenants without a permission, are unaffected."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.contract import dra
from gpupool.core.classes import ResourceClass
from gpupool.core.permissions import Permission
from gpupool.core.selector import Selector
from tests.go_format import sprintf

from .test_dra_prioritize import NS, ask, claim, claim_pod
from .test_dra_quota import filtered, first_available
from .test_dra_selectors import H100, cluster, with_selectors

A100 = "device.attributes['gpu.gpupool.io'].model == 'A100'"
NODES = ["mixed", "a"]


def only(model: str) -> Selector:
    return Selector.from_spec({"matchLabels": {"gpupool.io/model": model}})


def alternative(name: str, *selectors: str, **capacity: str) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "deviceClassName": dra.DRIVER}
    if selectors:
        out["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    if capacity:
        out["capacity"] = {"requests": capacity}
    return out


CASES: list[tuple[str, dict[str, Any], bool, list[str]]] = [
    ("an unselective whole GPU is refused where an H100 could be allocated",
     ask(), True, ["a"]),
    ("an unselective shared slice is refused there too",
     ask(memory="10Gi", cores="20"), True, ["a"]),
    ("two unselective GPUs: refused on mixed", ask(count=2), True, ["a"]),
    ("a selector of A100s only is admitted on the mixed node",
     with_selectors(ask(), A100), True, NODES),
    ("the DeviceClass of a class of A100s is admitted on the mixed node",
     ask(device_class="a100s.gpupool.io"), True, NODES),
    ("a firstAvailable alternative of any GPU is refused where it could take an H100",
     first_available(alternative("a100", A100), alternative("any")), True, ["a"]),
    ("a firstAvailable of A100 alternatives only is admitted",
     first_available(alternative("whole", A100), alternative("slice", A100, memory="10Gi")),
     True, NODES),
    ("a tenant without a GPUPermission is unaffected", ask(), False, NODES),
    ("a tenant without a GPUPermission may take any alternative",
     first_available(alternative("a100", A100), alternative("h100", H100)), False, NODES),
]


@pytest.mark.parametrize(("request_", "confined", "passed"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_a_confined_tenant_is_refused_nodes_where_its_claims_select_an_unpermitted_gpu(
        request_: dict[str, Any], confined: bool, passed: list[str]) -> None:
    cache = cluster({"mixed": ("A100", "A100", "H100"), "a": ("A100", "A100")})
    cache.catalogue.classes.put(ResourceClass("a100s", only("A100")))
    if confined:
        cache.catalogue.permissions.put(Permission("a100-only", frozenset({NS}),
                                                   gpus=only("A100")))
    with cache.lock:
        cache.dra.sync_claims(cache, [claim("c", [request_])])
    answer = filtered(cache, claim_pod("p", ("gpu", "c")), NODES)
    assert answer["NodeNames"] == passed
    refused = answer["FailedAndUnresolvableNodes"]
    assert set(refused) == set(NODES) - set(passed)
    for why in refused.values():
        assert why.startswith(f"gpupool: ResourceClaim {NS}/c selects GPUs on this node "
                              "outside GPUPermission a100-only"), why
        assert "select only permitted GPUs" in why and sprintf(why) == why


def test_a_node_of_permitted_gpus_only_admits_every_claim() -> None:
    cache = cluster({"a": ("A100", "A100")})
    cache.catalogue.permissions.put(Permission("a100-only", frozenset({NS}),
                                               gpus=only("A100")))
    with cache.lock:
        cache.dra.sync_claims(cache, [claim("c", [ask(count=2)])])
    assert filtered(cache, claim_pod("p", ("gpu", "c")), ["a"])["NodeNames"] == ["a"]


def test_the_claim_named_is_the_one_that_selects_the_unpermitted_gpu() -> None:
    """(A node without enough permitted GPUs for the claims keeps the reason that counts
    them: ``test_dra_tenancy``.)"""
    cache = cluster({"mixed": ("A100", "A100", "H100")})
    cache.catalogue.permissions.put(Permission("a100-only", frozenset({NS}),
                                               gpus=only("A100")))
    with cache.lock:
        cache.dra.sync_claims(cache, [claim("good", [with_selectors(ask(), A100)]),
                                      claim("wide", [ask()])])
    answer = filtered(cache, claim_pod("p", ("g", "good"), ("w", "wide")), ["mixed"])
    assert answer["NodeNames"] == []
    why = answer["FailedAndUnresolvableNodes"]["mixed"]
    assert f"ResourceClaim {NS}/wide selects" in why, why
