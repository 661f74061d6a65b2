"""The pure reconcile: observed objects -> the plan of writes (no API server here)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import merge_patch

from gpupool.contract import names
from gpupool.contract.devices import read_device
from gpupool.controller.defaults import ANNOTATION_MODELS, MANAGED_BY, class_name_for
from gpupool.controller.observed import observe
from gpupool.controller.reconcile import (
    CLASS,
    GROUP,
    CreateClass,
    DeleteClass,
    PatchClass,
    PatchStatus,
    Plan,
    reconcile,
)
from gpupool.controller.status import Verdict, condition, merge_diff
from gpupool.core.errors import InvalidInput
from tests.controller.builders import (
    GIB,
    device,
    group,
    model_selector,
    placed_pod,
    resource_class,
    sign,
    slices,
    verify,
)

NOW = "2026-01-02T03:04:05Z"
A100 = "A100-SXM4-80GB"


def plan_of(devices: list[Any] = (), classes: list[Any] = (), groups: list[Any] = (),
            pods: list[Any] = ()) -> Plan:  # type: ignore[assignment]
    return reconcile(observe(devices, classes, groups, pods, verify), NOW)


def actions(plan: Plan, kind: type) -> list[Any]:
    return [a for a in plan.actions if isinstance(a, kind)]


def status_of(plan: Plan, kind: str, name: str) -> dict[str, Any]:
    found = [a.patch for a in actions(plan, PatchStatus) if a.kind == kind and a.name == name]
    assert len(found) == 1, f"expected one status write for {kind} {name}, got {found}"
    return found[0]


def cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


# -- default classes ----------------------------------------------------------------
@pytest.mark.parametrize(("model", "name"), [
    ("A100-SXM4-80GB", "a100-sxm4-80gb"),
    ("Tesla T4", "tesla-t4"),
    ("NVIDIA H100 80GB HBM3", "nvidia-h100-80gb-hbm3"),
    ("V100_SXM2 (32GB)", "v100-sxm2-32gb"),
    ("---", "any"),
])
def test_default_class_name_is_a_dns_label_of_the_model(model: str, name: str) -> None:
    assert class_name_for(model) == name


def test_one_default_class_is_created_per_gpu_model_seen() -> None:
    plan = plan_of([device("n1", 0), device("n1", 1), device("n2", 0, "T4", 16 * GIB)])
    created = {a.obj["metadata"]["name"]: a.obj for a in actions(plan, CreateClass)}
    assert sorted(created) == ["a100-sxm4-80gb", "t4"]
    a100 = created["a100-sxm4-80gb"]
    assert a100["spec"]["selector"] == model_selector(A100)
    assert a100["metadata"]["labels"][MANAGED_BY] == "gpupool-controller"
    assert a100["metadata"]["annotations"][ANNOTATION_MODELS] == A100


def test_models_folding_to_one_name_share_one_class_listing_both() -> None:
    plan = plan_of([device("n1", 0, "A100 PCIe"), device("n2", 0, "a100-pcie")])
    [create] = actions(plan, CreateClass)
    assert create.obj["metadata"]["name"] == "a100-pcie"
    assert create.obj["spec"]["selector"] == model_selector("A100 PCIe", "a100-pcie")


def test_a_class_a_user_made_with_the_default_name_is_never_changed() -> None:
    user = resource_class("t4", {"matchLabels": {"team": "vision"}})
    plan = plan_of([device("n2", 0, "T4", 16 * GIB)], [user])
    assert actions(plan, CreateClass) == []
    assert actions(plan, PatchClass) == [] and actions(plan, DeleteClass) == []
    assert any("t4 was not made by the controller" in n for n in plan.notes)
    # only its status is written, and it says what the selector selects
    assert set(status_of(plan, CLASS, "t4")) <= {"conditions", "gpus", "pods", "allocated",
                                                 "allocatedByTenant"}


def test_an_owned_class_whose_spec_drifted_is_patched_back_with_its_resource_version() -> None:
    drifted = resource_class("t4", {"matchLabels": {"x": "y"}, **model_selector("T4", "T5")},
                             owned=True)
    plan = plan_of([device("n2", 0, "T4", 16 * GIB)], [drifted])
    [patch] = actions(plan, PatchClass)
    assert patch.name == "t4" and patch.resource_version == "7"
    assert patch.patch["spec"]["selector"] == {"matchLabels": None,
                                               "matchExpressions": model_selector("T4")[
                                                   "matchExpressions"]}
    assert patch.patch["metadata"] == {"annotations": {ANNOTATION_MODELS: "T4"}}


def test_an_owned_class_whose_model_is_gone_is_deleted() -> None:
    stale = resource_class("k80", model_selector("K80"), owned=True)
    plan = plan_of([device("n1", 0)], [stale])
    assert [a.name for a in actions(plan, DeleteClass)] == ["k80"]


def test_an_owned_class_is_kept_while_a_pod_still_holds_gpus_of_it() -> None:
    stale = resource_class("k80", model_selector("K80"), owned=True)
    pod = placed_pod("p", "lab", "n9", slices("n9", (0, 12 * GIB, 100)), exclusive=True,
                     class_name="k80")
    plan = plan_of([device("n1", 0)], [stale], pods=[pod])
    assert actions(plan, DeleteClass) == []
    assert status_of(plan, CLASS, "k80")["pods"] == 1


def test_a_user_class_is_never_deleted_even_without_matching_gpus() -> None:
    plan = plan_of([], [resource_class("k80", model_selector("K80"))])
    assert actions(plan, DeleteClass) == []


# -- class validation ----------------------------------------------------------------
@pytest.mark.parametrize(("name", "selector", "reason", "words"), [
    ("bad", {"matchExpressions": [{"key": "gpupool.io/memory", "operator": "Bigger",
                                   "values": ["10Gi"]}]}, "InvalidSelector", "operator 'Bigger'"),
    ("bad", {"matchExpressions": [{"key": "gpupool.io/memory", "operator": "Gt",
                                   "values": ["lots"]}]}, "InvalidSelector", "lots"),
    ("bad", {"matchExpressions": [{"key": "m", "operator": "In"}]}, "InvalidSelector",
     "at least one value"),
    ("bad", ["not", "a", "map"], "InvalidSelector", "spec.selector must be an object"),
    ("Bad_Name", {}, "InvalidName", "lower-case"),
])
def test_a_broken_class_gets_valid_false_with_a_reason_a_person_can_act_on(
        name: str, selector: Any, reason: str, words: str) -> None:
    plan = plan_of([device("n1", 0)], [resource_class(name, selector)])
    valid = cond(status_of(plan, CLASS, name), "Valid")
    assert (valid["status"], valid["reason"]) == ("False", reason)
    assert words in valid["message"]
    assert valid["lastTransitionTime"] == NOW


def test_a_valid_class_counts_the_gpus_it_selects() -> None:
    big = {"matchExpressions": [{"key": "gpupool.io/memory", "operator": "Gt",
                                 "values": ["40Gi"]}]}
    devices = [device("n1", 0), device("n1", 1), device("n2", 0, "T4", 16 * GIB)]
    status = status_of(plan_of(devices, [resource_class("big", big)]), CLASS, "big")
    assert status["gpus"] == 2
    valid = cond(status, "Valid")
    assert valid["status"] == "True" and "selects 2 of 3 GPUs" in valid["message"]


def test_identical_gpus_on_many_nodes_are_each_counted() -> None:
    devices = [device(f"n{i}", j) for i in range(5) for j in range(2)]
    devices += [device("t", 0, "T4", 16 * GIB, labels={"zone": "b"})]
    classes = [resource_class("a100", model_selector(A100)),
               resource_class("zone-b", {"matchLabels": {"zone": "b"}}),
               resource_class("first", {"matchLabels": {"gpupool.io/index": "0"}})]
    plan = plan_of(devices, classes)
    assert [status_of(plan, CLASS, n)["gpus"] for n in ("a100", "zone-b", "first")] == [10, 1, 6]


def test_a_class_selecting_nothing_says_which_labels_exist() -> None:
    status = status_of(plan_of([device("n1", 0)], [resource_class("h", model_selector("H100"))]),
                       CLASS, "h")
    assert status["gpus"] == 0
    assert f"models: {A100}" in cond(status, "Valid")["message"]


# -- quota status ----------------------------------------------------------------
def quota_world(limit: dict[str, Any]) -> Plan:
    devices = [device("n1", 0, "T4", 16 * GIB), device("n1", 1, "T4", 16 * GIB), device("n2", 0)]
    pods = [
        # exclusive whole T4: 1 GPU, 16384 MiB, 100 %
        placed_pod("a", "lab", "n1", slices("n1", (0, 16 * GIB, 100)), exclusive=True,
                   group_name="team"),
        # a shared slice: 1 GPU, 4096 MiB, 30 %
        placed_pod("b", "vision", "n1", slices("n1", (1, 4 * GIB, 30)), group_name="team"),
        # two slices on one A100: 1 distinct GPU, 2 x 8192 MiB, 2 x 20 %
        placed_pod("c", "lab", "n2", slices("n2", (0, 8 * GIB, 20), (0, 8 * GIB, 20)),
                   group_name="team"),
        # finished: holds nothing
        placed_pod("d", "lab", "n2", slices("n2", (0, 8 * GIB, 20)), group_name="team",
                   phase="Succeeded"),
        # another group
        placed_pod("e", "lab", "n2", slices("n2", (0, 1 * GIB, 5)), group_name="other"),
    ]
    return plan_of(devices, [], [group("team", nodes=["n1", "n2"], tenants=["lab", "vision"],
                                       quota=limit)], pods)


def test_group_quota_status_matches_hand_computed_numbers() -> None:
    status = status_of(quota_world({"gpus": 4, "memoryMiB": 32768}), GROUP, "team")
    assert status["gpus"] == 3
    assert status["pods"] == 3
    assert status["quota"] == {
        "allocated": {"gpus": 3, "memoryMiB": 16384 + 4096 + 16384, "corePct": 100 + 30 + 40},
        "limit": {"gpus": 4, "memoryMiB": 32768},
        "remaining": {"gpus": 1, "memoryMiB": 0},
    }
    assert status["allocatedByTenant"] == {
        "lab": {"gpus": 2, "memoryMiB": 32768, "corePct": 140},
        "vision": {"gpus": 1, "memoryMiB": 4096, "corePct": 30},
    }
    within = cond(status, "WithinQuota")
    assert within["status"] == "False" and within["reason"] == "OverLimit"
    assert "allocated 36864 MiB of GPU memory, over the limit of 32768" in within["message"]
    assert "4096 MiB of GPU memory are freed" in within["message"]


def test_a_group_within_its_quota_says_so() -> None:
    status = status_of(quota_world({"gpus": 10}), GROUP, "team")
    assert cond(status, "WithinQuota")["status"] == "True"
    assert status["quota"]["remaining"] == {"gpus": 7}


@pytest.mark.parametrize(("spec", "words"), [
    ({"quota": {"gpus": "two"}}, "spec.quota.gpus must be a whole number"),
    ({"quota": {"gpus": -1}}, "must be >= 0"),
    ({"quota": {"memory": 5}}, "unknown keys memory"),
    ({"nodes": "n1"}, "spec.nodes must be a list of strings"),
    ({"tenants": [""]}, "empty name"),
])
def test_a_broken_group_gets_valid_false_and_no_quota_numbers(
        spec: dict[str, Any], words: str) -> None:
    status = status_of(plan_of([device("n1", 0)], [], [group("g", **spec)]), GROUP, "g")
    valid = cond(status, "Valid")
    assert (valid["status"], valid["reason"]) == ("False", "InvalidSpec")
    assert words in valid["message"]
    assert "quota" not in status and [c["type"] for c in status["conditions"]] == ["Valid"]


def test_a_group_with_no_member_gpu_says_why() -> None:
    status = status_of(plan_of([device("n1", 0)], [], [group("g", nodes=["n7"])]), GROUP, "g")
    assert status["gpus"] == 0
    assert "none of the 1 nodes and 0 GPU uuids named" in cond(status, "Valid")["message"]


def test_a_pod_with_a_broken_decision_is_reported_on_its_group_not_fatal() -> None:
    broken = placed_pod("x", "lab", "n1", slices("n1", (0, GIB, 10)), group_name="team")
    broken["metadata"]["annotations"][names.ANNOTATION_ALLOCATION] = "{not json"
    sign(broken)  # signed as it is: a record gpupool wrote and cannot read back
    good = placed_pod("y", "lab", "n1", slices("n1", (0, GIB, 10)), group_name="team")
    plan = plan_of([device("n1", 0)], [], [group("team", nodes=["n1"])], [broken, good])
    status = status_of(plan, GROUP, "team")
    assert status["pods"] == 1
    [line] = status["unaccountedPods"]
    assert "uid-lab-x" in line and "not JSON" in line
    assert any(n.startswith("Pod lab/x:") for n in plan.notes)


def test_a_broken_gpudevice_is_a_note_and_the_rest_reconciles() -> None:
    bad = device("n1", 1)
    bad["spec"]["memoryMiB"] = "lots"
    plan = plan_of([device("n1", 0), bad])
    assert [a.obj["metadata"]["name"] for a in actions(plan, CreateClass)] == ["a100-sxm4-80gb"]
    assert any("GPUDevice gpu-n1-1" in n and "memoryMiB" in n for n in plan.notes)



def test_the_controller_sees_a_device_as_the_extender_does() -> None:
    """One reader for both: a device the extender takes in is never one the controller
    refuses (a memoryMiB of 0 or an index of true used to split them)."""
    sick = device("n1", 0)
    sick["status"] = {"health": "Unhealthy"}
    seen = observe([device("n1", 1), sick], [], [], [])
    assert [(p.gpu.index, p.gpu.healthy) for p in seen.gpus] == [(1, True), (0, False)]
    assert seen.gpus[0].gpu == read_device(device("n1", 1)).gpu
    for field, value in (("memoryMiB", 0), ("index", True)):
        bad = device("n1", 2)
        bad["spec"][field] = value
        with pytest.raises(InvalidInput, match=field) as refused:
            read_device(bad)
        assert [p.message for p in observe([bad], [], [], []).problems] == [str(refused.value)]


# -- idempotence ----------------------------------------------------------------
def applied(devices: list[Any], classes: list[Any], groups: list[Any], pods: list[Any],
            plan: Plan) -> tuple[list[Any], list[Any]]:
    """The classes and groups after ``plan`` (what the API server would hold)."""
    by_class = {c["metadata"]["name"]: copy.deepcopy(c) for c in classes}
    by_group = {g["metadata"]["name"]: copy.deepcopy(g) for g in groups}
    for a in plan.actions:
        if isinstance(a, CreateClass):
            by_class[a.obj["metadata"]["name"]] = copy.deepcopy(a.obj)
        elif isinstance(a, PatchClass):
            by_class[a.name] = merge_patch(by_class[a.name], a.patch)
        elif isinstance(a, DeleteClass):
            del by_class[a.name]
        else:
            table = by_class if a.kind == CLASS else by_group
            table[a.name]["status"] = merge_patch(table[a.name].get("status"), a.patch)
    return list(by_class.values()), list(by_group.values())


def test_reconciling_the_reconciled_world_plans_nothing() -> None:
    devices = [device("n1", 0), device("n2", 0, "T4", 16 * GIB)]
    classes = [resource_class("t4", model_selector("T4")),
               resource_class("gone", model_selector("K80"), owned=True),
               resource_class("bad", {"matchExpressions": [{"operator": "Nope"}]})]
    groups = [group("team", nodes=["n1"], quota={"gpus": 1}), group("broken", quota=3)]
    pods = [placed_pod("a", "lab", "n1", slices("n1", (0, GIB, 10)), group_name="team")]
    first = plan_of(devices, classes, groups, pods)
    assert first.actions
    classes2, groups2 = applied(devices, classes, groups, pods, first)
    later = reconcile(observe(devices, classes2, groups2, pods, verify), "2030-01-01T00:00:00Z")
    assert later.actions == ()


# -- status vocabulary ----------------------------------------------------------------
@pytest.mark.parametrize(("current", "desired", "patch"), [
    ({}, {}, {}),
    ({"a": 1}, {"a": 1}, {}),
    ({"a": 1}, {"a": 2}, {"a": 2}),
    ({"a": 1, "b": 2}, {"a": 1}, {"b": None}),
    ({"a": {"x": 1, "y": 2}}, {"a": {"x": 1}}, {"a": {"y": None}}),
    ({"a": [1, 2]}, {"a": [1]}, {"a": [1]}),
    ({}, {"a": {"x": 1}}, {"a": {"x": 1}}),
    ({"a": 1}, {"a": {"x": 1}}, {"a": {"x": 1}}),
])
def test_merge_diff_is_the_merge_patch_from_current_to_desired(
        current: dict[str, Any], desired: dict[str, Any], patch: dict[str, Any]) -> None:
    assert merge_diff(current, desired) == patch
    assert merge_patch(current, patch) == desired


def test_a_condition_keeps_its_transition_time_until_its_status_changes() -> None:
    old = [condition(Verdict("Valid", True, "SelectorValid", "ok"), [], "T1")]
    same = condition(Verdict("Valid", True, "SelectorValid", "still ok"), old, "T2")
    flipped = condition(Verdict("Valid", False, "InvalidSelector", "broken"), old, "T3")
    assert same["lastTransitionTime"] == "T1" and same["message"] == "still ok"
    assert flipped["lastTransitionTime"] == "T3" and flipped["status"] == "False"
