"""The contract's pod-spec translator is the one the scheduler extender, the controller and
``gpupool inspect`` all use, so what inspect explains is what the extender decides."""

from __future__ import annotations

import json
from typing import Any

import pytest
from lightkube.core.decoders import decode_object

from gpupool.contract import annotations as records
from gpupool.contract import names
from gpupool.contract.podspec_request import gpu_class_of, pod_request
from gpupool.controller.observed import holding_of
from gpupool.core.allocation import Allocation, Slice
from gpupool.core.errors import InvalidInput
from gpupool.core.request import Affinity, Mode
from gpupool.extender.state import pods as extender_pods
from gpupool.extender.wire import podspec as extender_podspec
from gpupool.kube.summaries import PodSummary


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
    "requests under limits": pod(c(limits={"cpu": "2"}, requests={"cpu": "1"})),
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


REFUSED = {"core above 100", "bytes for MiB", "zero GPUs with memory", "two classes",
           "count disagrees with class", "bad class name", "bad mode", "bad affinity",
           "fractional GPUs", "bad cpu", "containers not a list", "no name",
           "empty group label"}


def test_the_extender_translates_pods_with_the_contract_translator() -> None:
    assert extender_podspec.pod_request is pod_request


@pytest.mark.parametrize("case", sorted(set(PODS) - REFUSED))
def test_a_well_formed_pod_translates(case: str) -> None:
    request = pod_request(PODS[case])
    assert request.key in ("u1", "default/p")


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_broken_pod_is_refused_with_a_sentence_naming_it(case: str) -> None:
    with pytest.raises(InvalidInput) as err:
        pod_request(PODS[case])
    assert str(err.value)


def test_the_translation_reads_the_documented_names() -> None:
    req = pod_request(PODS["two containers, pod affinity"])
    assert req.key == "u1" and req.tenant == "lab" and req.affinity is Affinity.POD
    assert [(d.container, d.count, d.memory_mib, d.core_pct, d.mode) for d in req.gpus] == [
        ("a", 1, 1024, 0, Mode.SHARED), ("b", 1, 0, 10, Mode.SHARED)]
    assert pod_request(PODS["no namespace, no uid"]).key == "default/p"


def test_cpu_and_memory_count_requests_as_the_scheduler_does() -> None:
    both = pod_request(PODS["requests under limits"])
    assert both.cpu_milli == 1000  # the request, not the limit of 2
    only_limits = pod_request(pod(c(limits={"cpu": "2", "memory": "1Gi"})))
    assert (only_limits.cpu_milli, only_limits.memory_mib) == (2000, 1024)  # API defaulting


def test_the_class_of_a_pod_is_found_even_when_the_rest_is_broken() -> None:
    assert gpu_class_of(PODS["class GPUs"]) == "a100"
    assert gpu_class_of(PODS["two whole GPUs"]) is None
    assert gpu_class_of({"spec": {"containers": "nonsense"}}) is None


def held_pod(notes: dict[str, str], labels: dict[str, str] | None = None, node: str = "n7",
             phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "lab", "uid": "u1", "annotations": notes,
                         "labels": labels or {}},
            "spec": {"nodeName": node, "containers": [  # a GPU pod: only those hold GPUs
                {"name": "main", "resources": {"limits": {names.RESOURCE_MEMORY: "4096"}}}]},
            "status": {"phase": phase}}


def test_the_controller_and_the_extender_count_the_same_holdings_and_groups() -> None:
    alloc = Allocation("u1", "n7", 1000, 1024, (Slice("GPU-a", 0, 4096, 20, "main"),))
    decided = records.encode(alloc, "2026-01-02T03:04:05Z")
    group = {names.ANNOTATION_RESOURCE_GROUP: "team-a"}
    cases = {
        "decided": held_pod(decided),
        "decided, charged to a group": held_pod({**decided, **group}, {names.LABEL_GROUP: "x"}),
        "decided, a label (not signed) names a group": held_pod(decided, {
            names.LABEL_GROUP: "team-b"}),
        "failed": held_pod({**decided, **records.phase_patch(names.PHASE_FAILED, "no GPU")}),
        "bound elsewhere": held_pod(decided, node="n8"),
        "not bound yet": held_pod(decided, node=""),
        "finished": held_pod(decided, phase="Succeeded"),
        "no decision": held_pod({}),
    }
    seen = set()
    for case, obj in cases.items():
        # signatures are checked by both sides' own tests; here both count unsigned
        # decisions of GPU pods, to compare the rest of the rule
        facts = extender_pods.facts_of(decode_object(json.dumps(obj).encode(), PodSummary),
                                       lambda *args: bool(args[-1]))
        held = holding_of(obj, None)
        extender_held = None if facts.terminal else facts.decision
        assert (held.allocation if held else None) == extender_held, case
        if held is not None:
            assert held.group == facts.group, case
        seen.add((held is not None, held.group if held else None))
    assert seen == {(True, None), (True, "team-a"), (False, None)}  # labels never count
