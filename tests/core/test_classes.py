"""Resource classes (seed 004): names, resource names and GPU masks over labels."""

from __future__ import annotations

import pytest

from gpupool.contract import names
from gpupool.core.classes import (
    CLASS_RESOURCE_PREFIX,
    ClassCatalog,
    ResourceClass,
    class_of_resource,
    resource_name,
    selector_mask,
)
from gpupool.core.errors import InvalidInput, UnknownName
from gpupool.core.selector import Selector
from gpupool.core.state import ClusterState

from .builders import cluster, gpu, mixed, node


def test_the_class_resource_prefix_is_the_contract_name() -> None:
    assert CLASS_RESOURCE_PREFIX == names.CLASS_RESOURCE_PREFIX


@pytest.mark.parametrize(("resource", "cls"), [
    ("class.gpupool.io/a100", "a100"), ("class.gpupool.io/high-mem.v2", "high-mem.v2"),
    ("gpupool.io/gpu", None), ("nvidia.com/gpu", None)])
def test_a_class_resource_names_its_class(resource: str, cls: str | None) -> None:
    assert class_of_resource(resource) == cls
    if cls is not None:
        assert resource_name(cls) == resource


@pytest.mark.parametrize("resource", ["class.gpupool.io/", "class.gpupool.io/A100",
                                      "class.gpupool.io/a_b", "class.gpupool.io/" + "x" * 64])
def test_a_class_resource_with_a_bad_class_name_is_refused(resource: str) -> None:
    with pytest.raises(InvalidInput, match="resource class name"):
        class_of_resource(resource)


def test_a_class_knows_its_pod_and_quota_resource_names() -> None:
    c = ResourceClass("a100")
    assert c.resource_name == "class.gpupool.io/a100"
    assert c.quota_resource_name == "requests.class.gpupool.io/a100"
    with pytest.raises(InvalidInput):
        ResourceClass("Big GPUs")


def _gpus() -> ClusterState:
    return cluster(
        mixed("n0", gpu("k80", 0, "K80", 12, labels={"clock": "875M"}),
              gpu("p100", 1, "P100", 16, labels={"clock": "1.3G"})),
        mixed("n1", gpu("a100", 0, "A100", 80, labels={"clock": "1410M", "nvlink": "yes"})))


@pytest.mark.parametrize(("spec", "expected"), [
    ({"matchLabels": {"gpupool.io/model": "K80"}}, [[True, False], [False, False]]),
    ({"matchExpressions": [{"key": "gpupool.io/memory", "operator": "Gt", "values": ["10Gi"]}]},
     [[True, True], [True, False]]),
    ({"matchExpressions": [{"key": "gpupool.io/memory", "operator": "Gt", "values": ["16Gi"]}]},
     [[False, False], [True, False]]),
    ({"matchExpressions": [{"key": "gpupool.io/memory", "operator": "Lt", "values": ["16Gi"]}]},
     [[True, False], [False, False]]),
    ({"matchExpressions": [{"key": "clock", "operator": "Gt", "values": ["1G"]}]},
     [[False, True], [True, False]]),
    ({"matchExpressions": [{"key": "nvlink", "operator": "Exists"}]},
     [[False, False], [True, False]]),
    ({"matchExpressions": [{"key": "gpupool.io/model", "operator": "NotIn",
                            "values": ["K80", "P100"]}]}, [[False, False], [True, False]]),
    ({}, [[True, True], [True, False]]),
], ids=["by model", "memory > 10Gi", "memory > 16Gi (16Gi itself is not)", "memory < 16Gi",
        "clock > 1G", "has nvlink", "not K80 or P100", "the empty selector takes every GPU"])
def test_a_class_mask_marks_the_gpus_its_selector_matches(spec: dict[str, object],
                                                          expected: list[list[bool]]) -> None:
    s = _gpus()
    cat = ClassCatalog([ResourceClass("c", Selector.from_spec(spec))])
    assert cat.gpu_mask(s, "c").tolist() == expected


def test_class_masks_are_cached_per_epoch_and_follow_relabelled_gpus() -> None:
    s = cluster(node("n0", 2, labels=None))
    sel = Selector.from_spec({"matchLabels": {"tier": "gold"}})
    cat = ClassCatalog([ResourceClass("gold", sel)])
    first = cat.gpu_mask(s, "gold")
    assert first.tolist() == [[False, False]] and cat.gpu_mask(s, "gold") is first
    relabelled = mixed("n0", gpu("GPU-n0-0", 0, labels={"tier": "gold"}), gpu("GPU-n0-1", 1))
    s.replace_node(relabelled)
    assert cat.gpu_mask(s, "gold").tolist() == [[True, False]]
    assert not cat.gpu_mask(s, "gold").flags.writeable


def test_a_fresh_state_never_reuses_a_cached_mask() -> None:
    cat = ClassCatalog([ResourceClass("k80", Selector.from_spec(
        {"matchLabels": {"gpupool.io/model": "K80"}}))])
    for model, hit in [("K80", True), ("A100", False), ("K80", True)]:
        assert cat.gpu_mask(cluster(node("n", 1, model)), "k80").tolist() == [[hit]]


def test_an_unknown_class_is_named_with_the_known_ones() -> None:
    cat = ClassCatalog([ResourceClass("a"), ResourceClass("b")])
    with pytest.raises(UnknownName, match=r"class c does not exist \(known: a, b\)"):
        cat.get("c")
    assert cat.names() == ["a", "b"] and len(cat) == 2
    assert cat.remove("a") is not None and "a" not in cat


def test_the_uncached_mask_agrees_with_matching_each_gpu() -> None:
    s = _gpus()
    sel = Selector.from_spec({"matchExpressions": [{"key": "clock", "operator": "Lt",
                                                    "values": ["1.4G"]}]})
    c = ResourceClass("slow", sel)
    mask = selector_mask(s, sel)
    for i, n in enumerate(s.nodes):
        for j, g in enumerate(n.gpus):
            assert mask[i, j] == c.matches(g)
