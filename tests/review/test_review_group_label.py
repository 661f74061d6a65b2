"""Review: a pod's mutable ``gpupool.io/group`` label moves its charge into another group.

A pod bound without a resource group (bound before any group existed) carries no
``gpupool.io/resource-group`` annotation — its signed decision says group "" — and
``contract.annotations.group_of`` then falls back to the pod's ``gpupool.io/group``
label, which its author may change at any time (the webhook lets pod authors write that
label). A tenant that relabels such a running pod with another team's group charges its
GPU to that team's ResourceGroup quota whenever a cache is built from the pods (an
extender restart, the other replica once the ledger entry is pruned, the controller's
group status): the team's own pods are refused, and nothing checks that the relabelled
pod's namespace is among the group's tenants.
"""

from __future__ import annotations

import json
from typing import Any

from lightkube.core.decoders import decode_object
from lightkube.resources.core_v1 import Node

from gpupool.core.allocation import Allocation, Slice
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.state.signatures import DecisionCheck
from gpupool.kube.summaries import PodSummary
from tests.extender.builders import gpu_obj, local_keys, node_obj, pod_obj, signed

KEYS = local_keys()


def relabelled_pod() -> dict[str, Any]:
    """mallory's pod, bound to n1 with no group (signed), then labelled with team-a."""
    alloc = Allocation("u-evil", "n1", 0, 0, (Slice("GPU-n1-0", 0, 40960, 100, "c0"),))
    pod = pod_obj("evil", {"gpupool.io/gpu": "1"}, ns="mallory",
                  labels={"gpupool.io/group": "team-a"})
    pod["metadata"].update(uid="u-evil", resourceVersion="9",
                           annotations=signed(KEYS, alloc, "mallory", "evil"))
    pod["spec"]["nodeName"] = "n1"
    pod["status"]["phase"] = "Running"
    return pod


def test_relabelling_a_running_pod_does_not_charge_another_teams_group() -> None:
    cache = ClusterCache(decisions=DecisionCheck(KEYS))
    cache.sync_nodes([Node.from_dict(node_obj(n)) for n in ("n0", "n1")])
    cache.sync_devices([gpu_obj(n, j) for n in ("n0", "n1") for j in range(2)])
    cache.group_event("ADDED", {"metadata": {"name": "team-a"}, "spec": {
        "nodes": ["n0"], "tenants": ["team-a"], "quota": {"gpus": 1}}})
    cache.sync_pods([decode_object(json.dumps(relabelled_pod()).encode(), PodSummary)])
    with cache.lock:
        cache.flush()
    assert "u-evil" in cache.state.allocations  # the decision verifies and is held
    assert cache.catalogue.quotas.used_by_group("team-a").gpus == 0
