"""Reading a pod's gang and its terms: PodGroups (scheduling.k8s.io/v1alpha2) and
gpupool.io/gang labels, every broken input named, nothing raised."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.contract import names
from gpupool.contract.gangs import GangRef, GangTerms, gang_ref, label_terms, pod_group_terms
from gpupool.contract.tenancy import Broken
from gpupool.core.gang import Together


def group(policy: Any, notes: dict[str, str] | None = None, name: str = "train") -> Any:
    return {"metadata": {"name": name, "namespace": "lab", "annotations": notes or {}},
            "spec": {"schedulingPolicy": policy}}


def test_a_podgroup_wins_over_the_label_and_neither_means_no_gang() -> None:
    labels = {names.LABEL_GANG: "mine"}
    assert gang_ref("lab", labels, "train") == GangRef("lab", "train", True)
    assert gang_ref("lab", labels, None) == GangRef("lab", "mine", False)
    assert gang_ref("lab", {}, None) is None
    assert GangRef("lab", "x", True).key != GangRef("lab", "x", False).key


def test_a_gang_podgroup_gives_its_quorum_and_where_a_basic_one_no_gang() -> None:
    ref = GangRef("lab", "train", True)
    notes = {names.ANNOTATION_GANG_TOGETHER: "domain", names.ANNOTATION_GANG_DOMAIN: "rack"}
    assert pod_group_terms(group({"gang": {"minCount": 8}}, notes)) == \
        (ref, GangTerms(8, Together.DOMAIN, "rack"))
    assert pod_group_terms(group({"basic": {}})) == (ref, None)


@pytest.mark.parametrize(("policy", "notes", "says"), [
    ({"gang": {"minCount": 0}}, {}, "minCount 0 is not a whole number from 1 to 10000"),
    ({"gang": {"minCount": "8"}}, {}, "minCount '8' is not"),
    ({"gang": {}}, {}, "minCount None is not"),
    ({"gang": {"minCount": 2}}, {names.ANNOTATION_GANG_TOGETHER: "rack"},
     "gpupool.io/gang-together 'rack' is not one of anywhere, node, domain"),
], ids=["zero", "a string", "missing", "an unknown together"])
def test_a_broken_podgroup_says_which_field(policy: Any, notes: dict[str, str],
                                            says: str) -> None:
    read = pod_group_terms(group(policy, notes))
    assert isinstance(read, tuple) and isinstance(read[1], Broken)
    assert "PodGroup lab/train" in read[1].message and says in read[1].message


def test_a_podgroup_without_a_name_is_broken() -> None:
    assert isinstance(pod_group_terms({"metadata": {}}), Broken)


@pytest.mark.parametrize(("notes", "expected"), [
    ({names.ANNOTATION_GANG_MIN_COUNT: "4"}, GangTerms(4)),
    ({names.ANNOTATION_GANG_MIN_COUNT: "4", names.ANNOTATION_GANG_TOGETHER: "node"},
     GangTerms(4, Together.NODE)),
    ({}, "carry no gpupool.io/gang-min-count annotation"),
    ({names.ANNOTATION_GANG_MIN_COUNT: "-1"}, "'-1' is not a whole number"),
    ({names.ANNOTATION_GANG_MIN_COUNT: "99999999"}, "'99999999' is not a whole number"),
], ids=["a count", "on one node", "no count", "negative", "absurd"])
def test_a_labelled_member_states_its_gangs_terms(notes: dict[str, str],
                                                  expected: GangTerms | str) -> None:
    read = label_terms(GangRef("lab", "job", False), notes)
    if isinstance(expected, str):
        assert isinstance(read, Broken) and expected in read.message
        assert read.message.startswith("gang lab/job: ")
    else:
        assert read == expected
