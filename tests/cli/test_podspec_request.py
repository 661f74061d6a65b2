"""The contract's pod-spec translator (used by ``gpupool inspect`` and the controller) gives
the same answers as the scheduler extender's, so what inspect explains is what the
extender decides."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.contract.podspec_request import gpu_class_of, pod_request
from gpupool.controller.observed import ANNOTATION_RESOURCE_GROUP
from gpupool.core.errors import InvalidInput
from gpupool.core.request import Affinity, Mode
from gpupool.extender import pods as extender_pods
from gpupool.extender import podspec as extender_podspec


def pod(*containers: dict[str, Any], inits: tuple[dict[str, Any], ...] = (),
        annotations: dict[str, str] | None = None, labels: dict[str, Any] | None = None,
        ns: str | None = "lab", uid: str = "u1") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "uid": uid, "annotations": annotations or {},
                            "labels": labels or {}}
    if ns is not None:
        meta["namespace"] = ns
    return {"metadata": meta, "spec": {"containers": list(containers),
                                       "initContainers": list(inits)}}


def c(name: str = "main", limits: dict[str, Any] | None = None,
      requests: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "resources": {"limits": limits or {}, "requests": requests or {}}}


PODS = {
    "cpu only": pod(c(requests={"cpu": "500m", "memory": "1Gi"})),
    "two whole GPUs": pod(c(limits={"gpupool.io/gpu": 2, "cpu": 4})),
    "a memory slice": pod(c(limits={"gpupool.io/gpu-memory": "4096"})),
    "core without a count": pod(c(limits={"gpupool.io/gpu-core": 30})),
    "slice forced exclusive": pod(c(limits={"gpupool.io/gpu-core": 30}),
                                  annotations={"gpupool.io/mode": "Exclusive"}),
    "class GPUs": pod(c(limits={"class.gpupool.io/a100": 1, "gpupool.io/gpu-memory": 2048})),
    "two containers, pod affinity": pod(
        c("a", {"gpupool.io/gpu": 1, "gpupool.io/gpu-memory": 1024}),
        c("b", {"gpupool.io/gpu": 1, "gpupool.io/gpu-core": 10}),
        annotations={"gpupool.io/affinity": "pod"}),
    "init container larger": pod(c(requests={"cpu": "1"}), inits=(c("i", {"cpu": "3"}),)),
    "limits over requests": pod(c(limits={"cpu": "2"}, requests={"cpu": "1"})),
    "group label": pod(c(limits={"gpupool.io/gpu": 1}), labels={"gpupool.io/group": "team"}),
    "no namespace, no uid": pod(c(limits={"gpupool.io/gpu": 1}), ns=None, uid=""),
    "zero GPUs": pod(c(limits={"gpupool.io/gpu": 0})),
    # refused
    "core above 100": pod(c(limits={"gpupool.io/gpu-core": 150})),
    "bytes for MiB": pod(c(limits={"gpupool.io/gpu-memory": str(20 * 2**40)})),
    "zero GPUs with memory": pod(c(limits={"gpupool.io/gpu": 0, "gpupool.io/gpu-memory": 5})),
    "two classes": pod(c("a", {"class.gpupool.io/x": 1}), c("b", {"class.gpupool.io/y": 1})),
    "count disagrees with class": pod(c(limits={"class.gpupool.io/x": 1, "gpupool.io/gpu": 2})),
    "bad class name": pod(c(limits={"class.gpupool.io/Big_One": 1})),
    "bad mode": pod(c(limits={"gpupool.io/gpu": 1}), annotations={"gpupool.io/mode": "half"}),
    "bad affinity": pod(c(limits={"gpupool.io/gpu": 1}),
                        annotations={"gpupool.io/affinity": "near"}),
    "fractional GPUs": pod(c(limits={"gpupool.io/gpu": "1.5"})),
    "bad cpu": pod(c(limits={"cpu": "lots"})),
    "containers not a list": {"metadata": {"name": "p"}, "spec": {"containers": {"a": 1}}},
    "no name": {"metadata": {}, "spec": {}},
    "empty group label": pod(c(), labels={"gpupool.io/group": ""}),
}


@pytest.mark.parametrize("case", list(PODS))
def test_contract_and_extender_translate_every_pod_alike(case: str) -> None:
    body = PODS[case]
    try:
        expected = extender_podspec.pod_request(body)
    except InvalidInput:
        with pytest.raises(InvalidInput):
            pod_request(body)
        return
    assert pod_request(body) == expected


def test_the_translation_reads_the_documented_names() -> None:
    req = pod_request(PODS["two containers, pod affinity"])
    assert req.key == "u1" and req.tenant == "lab" and req.affinity is Affinity.POD
    assert [(d.container, d.count, d.memory_mib, d.core_pct, d.mode) for d in req.gpus] == [
        ("a", 1, 1024, 0, Mode.SHARED), ("b", 1, 0, 10, Mode.SHARED)]
    assert pod_request(PODS["no namespace, no uid"]).key == "default/p"


def test_the_class_of_a_pod_is_found_even_when_the_rest_is_broken() -> None:
    assert gpu_class_of(PODS["class GPUs"]) == "a100"
    assert gpu_class_of(PODS["two whole GPUs"]) is None
    assert gpu_class_of({"spec": {"containers": "nonsense"}}) is None


def test_the_controller_reads_the_group_annotation_the_extender_writes() -> None:
    assert ANNOTATION_RESOURCE_GROUP == extender_pods.ANNOTATION_RESOURCE_GROUP
