"""Reading the pods of preemption for remote slices, and its plan, as values: what no API
server serves (a priority that is not an integer, a selector of numbers, a time that is
not one) is skipped with a reason; the per-minute cap defers a plan whole; a remote slice
served to a node without GPUs holds its GPU."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.contract import annotations as records
from gpupool.controller.figures import cluster_state, pool_figures
from gpupool.controller.observed import observe
from gpupool.controller.remotepreempt import PreemptionConfig, RemotePlanner
from gpupool.controller.remotewaiting import candidates, waiting
from gpupool.core.allocation import Allocation, Slice
from gpupool.core.serving import ZONE_LABEL

from .builders import GIB, device, sign
from .test_remote_preemption_api import LATER, affinity, victim
from .test_remote_preemption_api import waiting as pending


def test_what_no_api_server_serves_is_skipped_with_a_reason_never_raised() -> None:
    bad_priority = pending("words", 40 * GIB, "high")
    flag_priority = pending("flag", 40 * GIB, True)
    bad_selector = pending("where", 40 * GIB, nodeSelector={"zone": 1})
    bad_time = pending("when", 40 * GIB)
    bad_time["status"]["conditions"][0]["lastTransitionTime"] = "yesterday"
    no_meta: dict[str, Any] = {"metadata": "broken", "spec": [], "status": None}
    bad_op = pending("op", 40 * GIB, affinity=affinity(
        [{"key": "zone", "operator": "Near", "values": ["a"]}]))
    bad_gt = pending("gt", 40 * GIB, affinity=affinity(
        [{"key": "cores", "operator": "Gt", "values": ["1k"]}]))
    bad_terms = pending("terms", 40 * GIB, affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": "any"}}})
    bad_field = pending("field", 40 * GIB, affinity=affinity(fields=[
        {"key": "metadata.uid", "operator": "In", "values": ["x"]}]))
    found, skips, _ = waiting([bad_priority, flag_priority, bad_selector, bad_time, no_meta,
                               bad_op, bad_gt, bad_terms, bad_field,
                               pending("fine", 40 * GIB)], LATER, 30.0)
    assert [w.name for w in found] == ["fine"]
    assert {s.pod: s.reason for s in skips} == {
        "lab/words": "spec.priority 'high' is not an integer",
        "lab/flag": "spec.priority True is not an integer",
        "lab/where": "spec.nodeSelector is not a map of strings",
        "lab/when": "condition PodScheduled has lastTransitionTime 'yesterday', not a time",
        "default/": "the pod's metadata must be a map, got str",
        "lab/op": "spec.affinity.nodeAffinity: operator 'Near' is not one of In, NotIn, "
                  "Exists, DoesNotExist, Gt, Lt",
        "lab/gt": "spec.affinity.nodeAffinity: cores Gt needs one integer, got ['1k']",
        "lab/terms": "spec.affinity.nodeAffinity: nodeSelectorTerms is not a list",
        "lab/field": "spec.affinity.nodeAffinity: matchFields key 'metadata.uid' is not "
                     "metadata.name"}


def test_a_node_admits_the_pod_when_every_selector_pair_and_one_affinity_term_match(
        ) -> None:
    pod = pending("p", 40 * GIB, nodeSelector={"pool": "x"}, affinity=affinity(
        [{"key": "cores", "operator": "Gt", "values": ["8"]}],
        [],  # an empty term matches no node
        fields=[{"key": "metadata.name", "operator": "In", "values": ["named"]}]))
    (w,), _, _ = waiting([pod], LATER, 30.0)
    assert w.admits("big", {"pool": "x", "cores": "16"})
    assert not w.admits("big", {"pool": "y", "cores": "16"})  # the nodeSelector too
    assert not w.admits("small", {"pool": "x", "cores": "4"})
    assert not w.admits("odd", {"pool": "x", "cores": "16k"})  # Gt compares integers only
    assert w.admits("named", {"pool": "x"})
    (plain,), _, _ = waiting([pending("q", 40 * GIB)], LATER, 30.0)
    assert plain.admits("any", {})


def test_a_placed_pod_whose_priority_cannot_be_read_is_never_a_victim() -> None:
    odd, fine = victim("odd", "g1", 40 * GIB, "low"), victim("fine", "g1", 40 * GIB, 1)
    observed = observe([device("g1", 0)], [], [], [odd, fine])
    by_uid = {p["metadata"]["uid"]: p for p in (odd, fine)}
    assert [c.key for c in candidates(observed.holdings, by_uid)] == ["uid-low-fine"]


def test_a_plan_over_the_per_minute_cap_waits_whole() -> None:
    objs = [victim("a", "g1", 40 * GIB, 1), victim("b", "g1", 40 * GIB, 1),
            pending("big", 80 * GIB)]
    observed = observe([device("g1", 0)], [], [], objs)
    planner = RemotePlanner(PreemptionConfig(per_minute=1))
    plan = planner.plan(observed, objs, {}, None, LATER)
    assert [(p.deferred, len(p.victims)) for p in plan.preemptions] == [(True, 2)]
    assert plan.preemptions[0].tier == "any node"  # no node labels known: one tier


def test_a_remote_slice_served_to_a_node_without_gpus_holds_its_gpu() -> None:
    alloc = Allocation("uid-low-r", "cpu-node", 1000, 1024,
                       (Slice("GPU-g1-0", 0, 80 * GIB, 10, "main"),), False, "g1")
    notes = records.encode(alloc, "2026-01-01T00:00:00Z")
    served = sign({"metadata": {"name": "r", "namespace": "low", "uid": "uid-low-r",
                                "annotations": {**notes, "gpupool.io/placement":
                                                "remote-required"}},
                   "spec": {"nodeName": "cpu-node", "priority": 1, "containers": [{
                       "name": "main", "resources": {"limits": {
                           "gpupool.io/remote-gpu": "1", "gpupool.io/gpu-memory": str(80 * GIB),
                           "gpupool.io/gpu-core": "10"}}}]},
                   "status": {"phase": "Running"}})
    objs = [served, pending("big", 40 * GIB)]
    observed = observe([device("g1", 0)], [], [], objs)
    plan = RemotePlanner().plan(observed, objs, {}, None, LATER)
    assert [(p.node, [v.name for v in p.victims]) for p in plan.preemptions] == [("g1", ["r"])]


def served_elsewhere() -> dict[str, Any]:
    """A running remote-required pod on a node without GPUs, its slice (all of GPU g1)
    served from g1."""
    alloc = Allocation("uid-low-r", "cpu-node", 1000, 1024,
                       (Slice("GPU-g1-0", 0, 80 * GIB, 10, "main"),), False, "g1")
    return sign({"metadata": {"name": "r", "namespace": "low", "uid": "uid-low-r",
                              "annotations": {**records.encode(alloc, "2026-01-01T00:00:00Z"),
                                              "gpupool.io/placement": "remote-required"}},
                 "spec": {"nodeName": "cpu-node", "containers": [{
                     "name": "main", "resources": {"limits": {
                         "gpupool.io/remote-gpu": "1", "gpupool.io/gpu-memory": str(80 * GIB),
                         "gpupool.io/gpu-core": "10"}}}]},
                 "status": {"phase": "Running"}})


def test_the_controllers_cluster_state_holds_a_gpu_served_to_a_node_without_gpus() -> None:
    state = cluster_state(observe([device("g1", 0)], [], [], [served_elsewhere()]))
    g1 = [n.name for n in state.nodes].index("g1")
    assert int(state.unit_free[g1][0]) == 0 and "cpu-node" in [n.name for n in state.nodes]


def test_pool_figures_count_a_slice_served_to_a_node_without_gpus_on_its_gpu() -> None:
    figures, _ = pool_figures(observe([device("g1", 0)], [], [], [served_elsewhere()]))
    assert [(f.gpus, f.allocated_milli) for f in figures] == [(1, 1000)]


NO_HOME_LABELS = {"g1": ((ZONE_LABEL, "a"),), "c1": ((ZONE_LABEL, "a"),)}


@pytest.mark.parametrize("where", [
    {"nodeSelector": {"pool": "does-not-exist"}},
    {"affinity": affinity(fields=[{"key": "metadata.name", "operator": "In",
                                   "values": ["no-such-node"]}])},
], ids=["a node selector", "a node affinity"])
def test_a_pod_no_node_admits_evicts_nobody_round_after_round(where: dict[str, Any]) -> None:
    """kube-scheduler can place it nowhere: evicting others would only churn them."""
    pod = pending("p", 40 * GIB, **where)
    planner = RemotePlanner(PreemptionConfig())
    for round_no in range(3):  # past each promise and hold
        objs = [victim(f"v{round_no}", "g1", 80 * GIB, 1), pod]
        plan = planner.plan(observe([device("g1", 0)], [], [], objs), objs, NO_HOME_LABELS,
                            None, LATER + round_no * 130.0)
        assert plan.preemptions == ()
        assert [s.reason for s in plan.skipped] == [
            "evicting others would not help: no node matches its nodeSelector and required "
            "node affinity, so kube-scheduler can place it nowhere"]
