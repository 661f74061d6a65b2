"""A pod is translated once per resourceVersion: a changed pod (new version) is read again."""

from __future__ import annotations

from lightkube.resources.core_v1 import Node

from gpupool.core.policies import DEFAULT_POLICY
from gpupool.extender.metrics import Metrics
from gpupool.extender.service import Extender, Settings
from gpupool.extender.state.cache import ClusterCache

from .builders import gpu_obj, node_obj, pod_obj


def test_a_new_resource_version_of_the_pod_is_translated_again() -> None:
    cache = ClusterCache()
    cache.sync_nodes([Node.from_dict(node_obj("n0"))])
    cache.sync_devices([gpu_obj("n0", j) for j in range(2)])
    ext = Extender(cache, Settings(DEFAULT_POLICY), Metrics())
    pod = pod_obj("p", {"gpupool.io/gpu": "2"})
    pod["metadata"].update(uid="u1", resourceVersion="7")
    assert ext.filter({"Pod": pod, "NodeNames": ["n0"]})["NodeNames"] == ["n0"]
    assert ext.requests["u1"].gpus[0].count == 2
    for kind in ("requests", "limits"):  # extended resources: both, equal (API validation)
        pod["spec"]["containers"][0]["resources"].setdefault(kind, {})["gpupool.io/gpu"] = "3"
    pod["metadata"]["resourceVersion"] = "8"
    assert ext.filter({"Pod": pod, "NodeNames": ["n0"]})["NodeNames"] == []
    assert ext.requests["u1"].gpus[0].count == 3
