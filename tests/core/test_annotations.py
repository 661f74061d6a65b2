"""The annotation codec: round trips, and a clear error for every broken annotation."""

from __future__ import annotations

import json

import pytest

from gpupool.contract import names
from gpupool.contract.annotations import (
    MAX_ANNOTATION_BYTES,
    decode,
    encode,
    has_decision,
    phase_patch,
)
from gpupool.core.allocation import Allocation, Slice
from gpupool.core.errors import InvalidInput

T = "2026-01-02T03:04:05Z"

ROUND_TRIPS = [
    Allocation("uid-1", "n7", 4000, 8192, (Slice("GPU-a", 3, 4096, 30, "main"),)),
    Allocation("uid-2", "n1", 0, 0, (Slice("GPU-a", 0, 40960, 100, "x"),
                                     Slice("GPU-b", 1, 40960, 100, "x")), exclusive=True),
    Allocation("uid-3", "n1", 500, 0, (Slice("GPU-a", 0, 1024, 10, "a"),
                                       Slice("GPU-a", 0, 2048, 20, "b"),
                                       Slice("GPU-b", 1, 2048, 20, "b"))),
    Allocation("uid-4", "n1", 100, 64),
    Allocation("uid-5", "n1", 0, 0, (Slice("GPU-a", 0, 512, 5),)),
    Allocation("uid-6", "cpu-node", 2000, 4096, (Slice("GPU-g", 2, 8192, 0, "main"),),
               served_by="gpu-node"),
    Allocation("uid-7", "n1", 100, 64, (Slice("GPU-a", 0, 1024, 10, "main"),), served_by="n1"),
]


@pytest.mark.parametrize("alloc", ROUND_TRIPS, ids=["one slice", "two whole GPUs",
                                                   "two containers sharing a GPU", "CPU only",
                                                   "an unnamed container",
                                                   "served from another node",
                                                   "served by a slice server on its own node"])
@pytest.mark.parametrize("phase", names.PHASES)
def test_an_allocation_survives_encode_and_decode(alloc: Allocation, phase: str) -> None:
    annotations = encode(alloc, T, phase)
    assert annotations[names.ANNOTATION_NODE] == alloc.node
    assert has_decision(annotations)
    decision = decode(alloc.key, annotations)
    assert (decision.allocation, decision.phase, decision.bind_time) == (alloc, phase, T)


def test_the_phase_advances_with_a_reason_kept_short() -> None:
    annotations = encode(ROUND_TRIPS[0], T)
    annotations.update(phase_patch(names.PHASE_FAILED, "x" * 5000))
    decision = decode("uid-1", annotations)
    assert decision.phase == names.PHASE_FAILED and len(decision.reason) == 1024
    assert phase_patch(names.PHASE_ALLOCATED) == {names.ANNOTATION_PHASE: "allocated"}


@pytest.mark.parametrize("annotations", [None, {}, {"other": "x"}])
def test_a_pod_without_the_annotation_has_no_decision(annotations: dict[str, str] | None
                                                      ) -> None:
    assert not has_decision(annotations)


def _body(**change: object) -> dict[str, str]:
    body: dict[str, object] = {
        "v": 1, "node": "n7", "cpuMilli": 4000, "memoryMiB": 8192, "exclusive": False,
        "containers": [{"name": "main", "gpus": [
            {"uuid": "GPU-a", "index": 3, "memoryMiB": 4096, "corePct": 30}]}]}
    body.update(change)
    return {names.ANNOTATION_ALLOCATION: json.dumps(body)}


def _gpu(**change: object) -> dict[str, str]:
    gpu: dict[str, object] = {"uuid": "GPU-a", "index": 3, "memoryMiB": 4096, "corePct": 30}
    gpu.update(change)
    return _body(containers=[{"name": "main", "gpus": [gpu]}])


BROKEN = [
    ("no allocation annotation", {}, "has no gpupool.io/allocation annotation"),
    ("too large", {names.ANNOTATION_ALLOCATION: "x" * (MAX_ANNOTATION_BYTES + 1)}, "too large"),
    ("not JSON", {names.ANNOTATION_ALLOCATION: "{nope"}, "is not JSON"),
    ("a JSON list", {names.ANNOTATION_ALLOCATION: "[]"}, "is not version 1"),
    ("another version", _body(v=3), "is not version 1 or 2"),
    ("version 2 without its serving node", _body(v=2), "field 'servedBy' is missing"),
    ("an empty serving node", _body(v=2, servedBy=""), "field 'servedBy' is missing"),
    ("a serving node in version 1", _body(servedBy="n8"), "'servedBy' needs version 2"),
    ("no node", _body(node=None), "field 'node' is missing"),
    ("an empty node", _body(node=""), "field 'node' is missing"),
    ("node annotation disagrees", {**_body(), names.ANNOTATION_NODE: "n8"},
     "gpupool.io/node disagrees"),
    ("containers not a list", _body(containers={}), "field 'containers' is missing"),
    ("a container not an object", _body(containers=["main"]), "container entry is not an object"),
    ("a container without name", _body(containers=[{"gpus": []}]), "field 'name' is missing"),
    ("gpus not a list", _body(containers=[{"name": "c", "gpus": "GPU-a"}]),
     "field 'gpus' is missing"),
    ("a GPU not an object", _body(containers=[{"name": "c", "gpus": ["GPU-a"]}]),
     "GPU entry of c is not an object"),
    ("a GPU without uuid", _gpu(uuid=None), "field 'uuid' is missing"),
    ("a negative index", _gpu(index=-1), "field 'index' must be a whole number"),
    ("a fractional core", _gpu(corePct=1.5), "field 'corePct' must be a whole number"),
    ("memory as a string", _gpu(memoryMiB="4096"), "field 'memoryMiB' must be a whole number"),
    ("memory as a boolean", _gpu(memoryMiB=True), "field 'memoryMiB' must be a whole number"),
    ("an absurd number", _gpu(memoryMiB=2**41), "field 'memoryMiB' must be a whole number"),
    ("CPU missing", _body(cpuMilli=None), "field 'cpuMilli' must be a whole number"),
    ("exclusive as a string", _body(exclusive="no"), "'exclusive' must be true or false"),
    ("an unknown phase", {**_body(), names.ANNOTATION_PHASE: "done"}, "unknown phase 'done'"),
]


@pytest.mark.parametrize(("annotations", "needle"), [b[1:] for b in BROKEN],
                         ids=[b[0] for b in BROKEN])
def test_a_broken_annotation_is_refused_with_what_is_broken(annotations: dict[str, str],
                                                            needle: str) -> None:
    with pytest.raises(InvalidInput, match=needle):
        decode("uid-1", annotations)


def test_the_reference_body_itself_decodes() -> None:
    assert decode("uid-1", _body()).allocation == ROUND_TRIPS[0]


def test_a_local_decision_is_written_as_version_1_without_a_serving_node() -> None:
    body = json.loads(encode(ROUND_TRIPS[0], T)[names.ANNOTATION_ALLOCATION])
    assert body["v"] == 1 and "servedBy" not in body
    assert body == json.loads(_body()[names.ANNOTATION_ALLOCATION])


def test_a_remote_decision_names_the_pods_node_and_the_serving_node() -> None:
    annotations = encode(ROUND_TRIPS[5], T)
    body = json.loads(annotations[names.ANNOTATION_ALLOCATION])
    assert (body["v"], body["node"], body["servedBy"]) == (2, "cpu-node", "gpu-node")
    assert annotations[names.ANNOTATION_NODE] == "cpu-node"  # where the pod is bound


@pytest.mark.parametrize("call", [lambda: encode(ROUND_TRIPS[0], T, "done"),
                                  lambda: phase_patch("done")], ids=["encode", "phase_patch"])
def test_writing_an_unknown_phase_is_refused(call: object) -> None:
    with pytest.raises(InvalidInput, match="unknown phase 'done'"):
        call()  # type: ignore[operator]
