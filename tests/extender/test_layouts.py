"""Answers follow the cache's layout: a rebuilt state with other nodes (even as many as
before, so its epoch and size match the old one's) is named by its own nodes."""

from __future__ import annotations

from lightkube.resources.core_v1 import Node

from gpupool.core.policies import DEFAULT_POLICY
from gpupool.extender.metrics import Metrics
from gpupool.extender.service import Extender, Settings
from gpupool.extender.state.cache import ClusterCache

from .builders import gpu_obj, node_obj, pod_obj


def lay_out(cache: ClusterCache, names: list[str]) -> None:
    cache.sync_nodes([Node.from_dict(node_obj(n)) for n in names])
    cache.sync_devices([gpu_obj(n, j) for n in names for j in range(2)])


def hosts(ext: Extender, names: list[str]) -> tuple[list[str], list[str]]:
    """(names filter passes, hosts prioritize scores) for a one-GPU pod."""
    pod = pod_obj("p", {"gpupool.io/gpu": "1"})
    passing = ext.filter({"Pod": pod, "NodeNames": names})["NodeNames"]
    scored = [h["Host"] for h in ext.prioritize({"Pod": pod, "NodeNames": passing}).items()]
    return passing, scored


def test_a_rebuilt_layout_of_the_same_size_is_answered_with_its_own_names() -> None:
    cache = ClusterCache()
    ext = Extender(cache, Settings(DEFAULT_POLICY), Metrics())
    lay_out(cache, ["a0", "a1", "a2"])
    assert hosts(ext, ["a0", "a1", "a2"]) == (["a0", "a1", "a2"], ["a0", "a1", "a2"])
    lay_out(cache, ["b0", "b1", "b2"])
    assert hosts(ext, ["b0", "b1", "b2"]) == (["b0", "b1", "b2"], ["b0", "b1", "b2"])
    assert hosts(ext, ["a0", "b1"]) == (["b1"], ["b1"])
