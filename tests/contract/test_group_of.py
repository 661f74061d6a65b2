"""``contract.annotations.group_of``: whom a pod is charged to. A pod with a decision, the
signed group alone; a pod not bound yet, the group its label asks for."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.contract import names
from gpupool.contract.annotations import group_of

DECIDED = {names.ANNOTATION_ALLOCATION: '{"v":1}'}
LABEL = {names.LABEL_GROUP: "team-a"}


@pytest.mark.parametrize(("notes", "labels", "group"), [
    ({**DECIDED, names.ANNOTATION_RESOURCE_GROUP: "team-b"}, LABEL, "team-b"),
    (DECIDED, LABEL, None),
    ({**DECIDED, names.ANNOTATION_RESOURCE_GROUP: ""}, LABEL, None),
    ({}, LABEL, "team-a"),
    (None, LABEL, "team-a"),
    ({}, {}, None),
    ("not a map", "not a map", None),
])
def test_a_decided_pod_is_charged_to_its_signed_group_and_a_pending_one_to_its_label(
        notes: Any, labels: Any, group: str | None) -> None:
    assert group_of(notes, labels) == group
