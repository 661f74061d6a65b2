"""Pod JSON -> PodRequest at the extender's edge, and clear refusals of absurd pods."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from lightkube.core.decoders import decode_object

from gpupool.core.errors import InvalidInput
from gpupool.core.request import Affinity, Mode
from gpupool.extender.state.pods import facts_of
from gpupool.extender.wire.podspec import pod_request
from gpupool.kube.summaries import PodSummary

from .builders import pod_obj


def with_uid(pod: dict[str, Any]) -> dict[str, Any]:
    pod["metadata"]["uid"] = "uid-1"
    return pod


def test_a_shared_pod_asks_memory_and_core_on_one_gpu() -> None:
    r = pod_request(with_uid(pod_obj("a", {"gpupool.io/gpu-memory": "8192",
                                           "gpupool.io/gpu-core": "30"}, cpu="500m")))
    assert r.key == "uid-1" and r.tenant == "default" and r.cpu_milli == 500
    (d,) = r.gpus
    assert (d.count, d.memory_mib, d.core_pct, d.mode) == (1, 8192, 30, Mode.SHARED)


def test_a_gpu_count_alone_asks_whole_gpus() -> None:
    (d,) = pod_request(with_uid(pod_obj("a", {"gpupool.io/gpu": "2"}))).gpus
    assert (d.count, d.mode) == (2, Mode.EXCLUSIVE)


def test_the_mode_annotation_overrides_the_default() -> None:
    pod = pod_obj("a", {"gpupool.io/gpu-memory": "4096"},
                  annotations={"gpupool.io/mode": "exclusive", "gpupool.io/affinity": "pod"})
    r = pod_request(with_uid(pod))
    assert r.gpus[0].mode is Mode.EXCLUSIVE and r.affinity is Affinity.POD


def test_a_class_resource_names_the_class_and_the_count() -> None:
    r = pod_request(with_uid(pod_obj("a", {"class.gpupool.io/a100-80g": "2"})))
    assert r.gpu_class == "a100-80g" and r.gpus[0].count == 2


def test_the_group_label_and_namespace_become_group_and_tenant() -> None:
    r = pod_request(with_uid(pod_obj("a", {"gpupool.io/gpu": "1"}, ns="team-a",
                                     labels={"gpupool.io/group": "training"})))
    assert (r.group, r.tenant) == ("training", "team-a")


def test_a_pod_without_gpupool_resources_asks_no_gpu() -> None:
    assert pod_request(with_uid(pod_obj("a"))).gpus == ()


def test_init_containers_count_by_their_largest() -> None:
    pod = pod_obj("a", {"gpupool.io/gpu": "1"}, cpu="1")
    pod["spec"]["initContainers"] = [{"name": "i", "resources": {"requests": {"cpu": "3"}}}]
    assert pod_request(with_uid(pod)).cpu_milli == 3000


@pytest.mark.parametrize(("limits", "annotations", "needle"), [
    ({"gpupool.io/gpu-core": "150"}, {}, "must be 1..100"),
    ({"gpupool.io/gpu-memory": "-5"}, {}, "non-negative whole number"),
    ({"gpupool.io/gpu-memory": "1.5"}, {}, "non-negative whole number"),
    ({"gpupool.io/gpu-memory": "lots"}, {}, "not a Kubernetes quantity"),
    ({"gpupool.io/gpu": "1000"}, {}, "at most 64"),
    ({"gpupool.io/gpu-memory": str(2**40)}, {}, "absurd"),
    ({"gpupool.io/gpu": "0", "gpupool.io/gpu-core": "10"}, {}, "is 0 but"),
    ({"class.gpupool.io/a": "1", "class.gpupool.io/b": "1"}, {}, "several classes"),
    ({"class.gpupool.io/Bad_Name": "1"}, {}, "resource class name"),
    ({"gpupool.io/gpu": "2", "class.gpupool.io/a": "1"}, {}, "disagrees"),
    ({"gpupool.io/gpu": "1"}, {"gpupool.io/mode": "sometimes"}, "exclusive or shared"),
    ({"gpupool.io/gpu": "1"}, {"gpupool.io/affinity": "node"}, "pod or least-loaded"),
])
def test_absurd_pods_are_refused_with_a_sentence(limits: dict[str, str],
                                                 annotations: dict[str, str],
                                                 needle: str) -> None:
    with pytest.raises(InvalidInput, match=needle) as info:
        pod_request(with_uid(pod_obj("weird", limits, annotations=annotations)))
    assert "default/weird" in str(info.value)


@pytest.mark.parametrize("pod", [
    {"metadata": {}},
    {"metadata": {"name": "a"}, "spec": {"containers": "nope"}},
    {"metadata": {"name": "a"}, "spec": {"containers": [{"resources": []}]}},
    {"metadata": "x"},
])
def test_malformed_pod_json_is_invalid_input(pod: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):
        pod_request(pod)


def test_a_bound_pod_is_charged_the_cpu_and_memory_its_filter_asked_for() -> None:
    """Filter (``pod_request``) and the cache's accounting of bound pods (``facts_of``)
    count a container's requests, and its limits where it has no request."""
    pod = pod_obj("p", {"gpupool.io/gpu": "1"})
    main = pod["spec"]["containers"][0]["resources"]
    main["requests"].update(cpu="1", memory="1Gi")
    main["limits"].update(cpu="4", memory="4Gi")
    pod["spec"]["containers"].append({"name": "side", "resources": {"limits": {
        "cpu": "500m", "memory": "256Mi"}}})  # limits only: the API defaults requests
    request = pod_request(pod)
    facts = facts_of(decode_object(msgspec.json.encode(pod), PodSummary))
    assert (request.cpu_milli, request.memory_mib) == (1500, 1280)
    assert (facts.cpu_milli, facts.memory_mib) == (request.cpu_milli, request.memory_mib)
