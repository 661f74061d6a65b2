"""Preempt bodies read from bytes keep one small struct per victim: the same answers as the
general reader for kube-scheduler's spelling (victims' UIDs, or whole pods), a small body
spelled otherwise still read, a large one refused with the reason."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from gpupool.core.errors import InvalidInput
from gpupool.extender.preemption import proposals
from gpupool.extender.wire import protocol

POD = {"metadata": {"name": "big", "namespace": "default", "uid": "u-big"}}


def meta_body(**extra: Any) -> dict[str, Any]:
    return {"Pod": POD, "NodeNameToMetaVictims": {
        "n0": {"Pods": [{"UID": "a"}, {"UID": "b"}], "NumPDBViolations": 1},
        "n1": {"Pods": [], "NumPDBViolations": 0}}, **extra}


def pods_body() -> dict[str, Any]:
    victim = {"metadata": {"name": "v", "uid": "a", "labels": {"x": "y"}},
              "spec": {"containers": [{"name": "c", "image": "i"}]}}
    return {"Pod": POD, "NodeNameToVictims": {"n0": {"Pods": [victim],
                                                     "NumPDBViolations": 2}}}


@pytest.mark.parametrize("body", [meta_body(), pods_body()], ids=["meta victims", "pods"])
def test_kube_schedulers_spelling_reads_as_the_general_reader_does(body: dict[str, Any]
                                                                   ) -> None:
    fast = proposals.read_preemption(msgspec.json.encode(body))
    general = protocol.parse_preemption(body)
    assert fast == general


def test_a_small_body_spelled_otherwise_is_still_read() -> None:
    body = {"pod": POD, "nodeNameToMetaVictims": {"n0": {"pods": [{"uid": "a"}],
                                                         "numPDBViolations": 0}}}
    args = proposals.read_preemption(msgspec.json.encode(body))
    assert args.victims == {"n0": ("a",)}


def test_a_large_body_spelled_otherwise_is_refused_with_the_reason() -> None:
    body = {"pod": POD, "nodeNameToMetaVictims": {"n0": {"pods": [
        {"uid": f"{k:036d}"} for k in range(30_000)]}}}
    raw = msgspec.json.encode(body)
    assert len(raw) > proposals.GENERAL_BYTES
    with pytest.raises(InvalidInput, match="spelled as kube-scheduler writes it"):
        proposals.read_preemption(raw)


@pytest.mark.parametrize("broken", [b"{", b"[]", b'{"Pod":{},"NodeNameToMetaVictims":7}',
                                    b'{"NodeNameToMetaVictims":{"n0":{"Pods":[]}}}'])
def test_a_broken_body_says_what_is_wrong(broken: bytes) -> None:
    with pytest.raises(InvalidInput):
        proposals.read_preemption(broken)
