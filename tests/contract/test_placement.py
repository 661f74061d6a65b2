"""``gpupool.io/placement``: where a pod's GPU slices may be served, as users write it."""

from __future__ import annotations

import re
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


def remote_pod(resources: dict[str, Any], placement: str = "remote-required",
               containers: int = 1) -> dict[str, Any]:
    return {"metadata": {"name": "train", "namespace": "lab", "uid": "u1",
                         "annotations": {names.ANNOTATION_PLACEMENT: placement}},
            "spec": {"containers": [{"name": f"c{i}", "resources": {"limits": resources}}
                                    for i in range(containers)]}}


def test_a_remote_required_pod_counts_its_gpu_as_remote_gpu() -> None:
    request = pod_request(remote_pod({"gpupool.io/remote-gpu": 1,
                                      "gpupool.io/gpu-memory": 4096}))
    assert request.serving is Serving.REMOTE_REQUIRED
    assert [(d.count, d.memory_mib) for d in request.gpus] == [(1, 4096)]


def test_an_exclusive_remote_gpu_is_one_whole_gpu() -> None:
    request = pod_request(remote_pod({"gpupool.io/remote-gpu": 1}))
    assert request.gpus[0].exclusive


def test_remote_gpu_without_remote_required_is_refused() -> None:
    with pytest.raises(InvalidInput, match=re.escape(
            "container c0 asks gpupool.io/remote-gpu, which only a pod annotated "
            "gpupool.io/placement: remote-required may ask")):
        pod_request(remote_pod({"gpupool.io/remote-gpu": 1}, "remote-allowed"))


def test_a_remote_required_pod_may_not_keep_the_device_count_once_admitted() -> None:
    written = remote_pod({"gpupool.io/gpu": 1, "gpupool.io/gpu-memory": 4096})
    with pytest.raises(InvalidInput, match=re.escape(
            "asks gpupool.io/gpu, which kube-scheduler counts against its node's own GPUs")):
        pod_request(written)
    assert pod_request(written, as_written=True).gpu_count == 1


def test_both_counts_in_one_container_are_refused() -> None:
    with pytest.raises(InvalidInput, match=re.escape(
            "asks both gpupool.io/gpu and gpupool.io/remote-gpu")):
        pod_request(remote_pod({"gpupool.io/gpu": 1, "gpupool.io/remote-gpu": 1}))


@pytest.mark.parametrize(("resources", "containers", "why"), [
    ({"gpupool.io/remote-gpu": 2}, 1, "asks 2 GPUs remotely: a remote slice is one GPU"),
    ({"gpupool.io/gpu-memory": 1024}, 2, "asks 2 GPUs remotely"),
    ({"mig.gpupool.io/1g.10gb": 1}, 1, "MIG devices are not served remotely"),
])
def test_what_remote_slices_do_not_serve_is_refused_with_the_reason(
        resources: dict[str, Any], containers: int, why: str) -> None:
    with pytest.raises(InvalidInput, match=why):
        pod_request(remote_pod(resources, containers=containers))


def test_a_sidecar_adds_to_the_pods_cpu_and_memory_as_kubernetes_sums_them() -> None:
    def init(name: str, cpu: str, sidecar: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"name": name, "resources": {"requests": {"cpu": cpu,
                                                                       "memory": "64Mi"}}}
        return {**out, "restartPolicy": "Always"} if sidecar else out
    spec = {"containers": [{"name": "main", "resources": {"requests": {"cpu": "1",
                                                                       "memory": "1Gi"}}}],
            "initContainers": [init("setup", "500m", False), init("proxy", "100m", True),
                               init("late", "2", False)]}
    request = pod_request({"metadata": {"name": "p", "namespace": "lab"}, "spec": spec})
    # the late init container runs beside the sidecar (2 + 0.1); the containers too (1 + 0.1)
    assert (request.cpu_milli, request.memory_mib) == (2100, 1024 + 64)
