"""``gpupool.io/placement``: where a pod's GPU slices may be served, as users write it."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gpupool.contract import names
from gpupool.contract.podshape import POD
from gpupool.contract.podspec_request import pod_request
from gpupool.contract.yamlcheck import YamlProblems, load_text
from gpupool.core.errors import InvalidInput
from gpupool.core.request import Serving


def pod(notes: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "train", "namespace": "lab", "uid": "u1",
                         "annotations": notes or {}},
            "spec": {"containers": [{"name": "main", "resources": {
                "limits": {"gpupool.io/gpu-memory": 8192}}}]}}


@pytest.mark.parametrize(("value", "serving"), [
    (None, Serving.LOCAL), ("", Serving.LOCAL), ("local", Serving.LOCAL),
    ("remote-allowed", Serving.REMOTE_ALLOWED), ("remote-required", Serving.REMOTE_REQUIRED),
    (" Remote-Allowed ", Serving.REMOTE_ALLOWED)])
def test_the_annotation_says_where_the_slices_may_be_served(value: str | None,
                                                            serving: Serving) -> None:
    notes = {} if value is None else {names.ANNOTATION_PLACEMENT: value}
    assert pod_request(pod(notes)).serving is serving


@pytest.mark.parametrize("value", ["remote", "anywhere", "remote_allowed", 3])
def test_an_unknown_placement_is_refused_naming_the_pod_and_the_values(value: object) -> None:
    with pytest.raises(InvalidInput) as caught:
        pod_request(pod({names.ANNOTATION_PLACEMENT: value}))
    assert str(caught.value) == (
        f"pod lab/train: annotation gpupool.io/placement={value!r} must be one of local, "
        "remote-allowed, remote-required")


def test_a_misspelt_placement_key_in_a_manifest_is_taken_for_a_typo() -> None:
    text = ("apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations:\n"
            "    gpupool.io/placment: remote-allowed\n"
            "spec:\n  containers: [{name: main}]\n")
    with pytest.raises(YamlProblems) as caught:
        load_text(text, "pod.yaml", POD, yaml.SafeLoader, yaml.YAMLError)
    assert "did you mean 'gpupool.io/placement'?" in str(caught.value)


def test_the_placement_key_itself_is_accepted_in_a_manifest() -> None:
    text = ("apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations:\n"
            "    gpupool.io/placement: remote-allowed\n"
            "spec:\n  containers: [{name: main}]\n")
    assert load_text(text, "pod.yaml", POD, yaml.SafeLoader, yaml.YAMLError)["metadata"]
