"""Filter and prioritize on request bytes, as kube-scheduler sends them: node names in a
different order for every pod, prioritize sent the filter answer's names back."""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import pytest
from lightkube.resources.core_v1 import Node

from gpupool.core.policies import DEFAULT_POLICY
from gpupool.extender.metrics import Metrics
from gpupool.extender.service import Extender, Settings
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.wire import nodenames

from .builders import gpu_obj, node_obj, pod_obj

WIDE = [f"wide-{i}" for i in range(12)]  # two GPUs each
NARROW = [f"narrow-{i}" for i in range(6)]  # one GPU: a two-GPU pod never fits


@pytest.fixture
def ext() -> Extender:
    cache = ClusterCache()
    cache.sync_nodes([Node.from_dict(node_obj(n)) for n in WIDE + NARROW])
    cache.sync_devices([gpu_obj(n, j) for n in WIDE for j in range(2)] +
                       [gpu_obj(n, 0) for n in NARROW])
    return Extender(cache, Settings(DEFAULT_POLICY), Metrics())


def pod(gpus: str, name: str = "p") -> dict[str, Any]:
    p = pod_obj(name, {"gpupool.io/gpu": gpus})
    p["metadata"].update(uid=f"uid-{name}", resourceVersion="1")
    return p


def body(p: dict[str, Any], names: bytes, keys: tuple[str, str] = ("Pod", "NodeNames")
         ) -> bytes:
    """ExtenderArgs as Go writes them (compact); ``names`` is the JSON array as sent."""
    return (f'{{"{keys[0]}":'.encode() + msgspec.json.encode(p) +
            f',"Nodes":null,"{keys[1]}":'.encode() + names + b"}")


def shuffled(names: list[str], seed: int) -> list[str]:
    return random.Random(seed).sample(names, len(names))


@pytest.mark.parametrize("numpy_from", [0, nodenames.SHORT_LIST])
def test_shuffled_lists_are_answered_in_the_order_sent(
        ext: Extender, numpy_from: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nodenames, "SHORT_LIST", numpy_from)  # 0: every list by numpy
    for seed in range(5):
        sent = shuffled(WIDE + NARROW, seed)
        answer = msgspec.json.decode(ext.filter_json(body(pod("2"), msgspec.json.encode(sent))))
        assert answer["Error"] == ""
        assert answer["NodeNames"] == [n for n in sent if n in WIDE]
        assert set(answer["FailedAndUnresolvableNodes"]) == set(NARROW)


def test_when_every_node_passes_the_sent_list_is_echoed(ext: Extender) -> None:
    for names in (msgspec.json.encode(shuffled(WIDE, 1)), b'[ "wide-3" ,\n "wide-1" ]'):
        answer = ext.filter_json(body(pod("1"), names))
        assert b'"NodeNames":' + names + b"," in answer
        assert json.loads(answer)["NodeNames"] == json.loads(names)


def test_a_partial_answer_is_compact_and_prioritize_reuses_its_rows(
        ext: Extender, monkeypatch: pytest.MonkeyPatch) -> None:
    sent = shuffled(WIDE + NARROW, 2)
    answer = ext.filter_json(body(pod("2"), msgspec.json.encode(sent)))
    passing = [n for n in sent if n in WIDE]
    assert b'"NodeNames":' + msgspec.json.encode(passing) + b"," in answer

    def no_parsing(raw: bytes) -> None:
        raise AssertionError("prioritize parsed a list it was answered with")

    monkeypatch.setattr(nodenames, "tokens", no_parsing)
    scores = ext.prioritize_json(body(pod("2"), msgspec.json.encode(passing)))
    hosts = msgspec.json.decode(scores)
    assert hosts == json.loads(scores)
    assert {h["Host"] for h in hosts} <= set(passing)
    assert all(0 < h["Score"] <= 10 for h in hosts)


@pytest.mark.parametrize("numpy_from", [0, nodenames.SHORT_LIST])
def test_unknown_names_mixed_in_are_refused_for_good(
        ext: Extender, numpy_from: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nodenames, "SHORT_LIST", numpy_from)
    sent = [WIDE[0], "cpu-only-1", WIDE[1], "cpu-only-2"]
    answer = msgspec.json.decode(ext.filter_json(body(pod("1"), msgspec.json.encode(sent))))
    assert answer["NodeNames"] == [WIDE[0], WIDE[1]]
    assert set(answer["FailedAndUnresolvableNodes"]) == {"cpu-only-1", "cpu-only-2"}
    assert "no GPUDevice" in answer["FailedAndUnresolvableNodes"]["cpu-only-2"]
    hosts = msgspec.json.decode(ext.prioritize_json(body(pod("1"), msgspec.json.encode(sent))))
    assert {h["Host"] for h in hosts} <= {WIDE[0], WIDE[1]}


def test_whitespace_between_tokens_reads_the_same(ext: Extender) -> None:
    sent = shuffled(WIDE + NARROW, 3)
    compact = ext.filter_json(body(pod("2"), msgspec.json.encode(sent)))
    spaced = json.dumps({"Pod": pod("2"), "Nodes": None, "NodeNames": sent}, indent=2).encode()
    assert msgspec.json.decode(ext.filter_json(spaced)) == msgspec.json.decode(compact)


def test_top_level_keys_are_read_case_insensitively(ext: Extender) -> None:
    names = msgspec.json.encode(WIDE[:3])
    answer = msgspec.json.decode(ext.filter_json(body(pod("1"), names, ("pod", "NODENAMES"))))
    assert answer["NodeNames"] == WIDE[:3]


def test_bytes_and_decoded_callers_get_the_same_answers(ext: Extender) -> None:
    sent = shuffled(WIDE + NARROW + ["elsewhere"], 4)
    from_bytes = msgspec.json.decode(ext.filter_json(body(pod("2"), msgspec.json.encode(sent))))
    assert ext.filter({"Pod": pod("2"), "NodeNames": sent}) == from_bytes
    passing = from_bytes["NodeNames"]
    assert ext.prioritize({"Pod": pod("2"), "NodeNames": passing}).items() == \
        msgspec.json.decode(ext.prioritize_json(body(pod("2"), msgspec.json.encode(passing))))


def test_a_node_list_is_answered_with_the_nodes_sent(ext: Extender) -> None:
    items = [node_obj(n) for n in (NARROW[0], WIDE[5], WIDE[2])]
    raw = b'{"Pod":' + msgspec.json.encode(pod("2")) + b',"Nodes":{"items":' + \
        msgspec.json.encode(items) + b'},"NodeNames":null}'
    answer = msgspec.json.decode(ext.filter_json(raw))
    assert answer["NodeNames"] is None and answer["Nodes"]["items"] == items[1:]


def test_a_node_lists_names_are_looked_up_without_parsing_them_again(
        ext: Extender, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: object, raw: bytes) -> None:
        raise AssertionError("the NodeList's names were rendered and parsed again")
    monkeypatch.setattr(nodenames.NameTable, "match", refuse)
    items = [node_obj(n) for n in (NARROW[1], "cpu-only", WIDE[3])]
    raw = b'{"Pod":' + msgspec.json.encode(pod("2")) + b',"Nodes":{"items":' + \
        msgspec.json.encode(items) + b'},"NodeNames":null}'
    answer = msgspec.json.decode(ext.filter_json(raw))
    assert answer["Nodes"]["items"] == items[2:]
    refused = {**answer["FailedNodes"], **answer["FailedAndUnresolvableNodes"]}
    assert sorted(refused) == sorted([NARROW[1], "cpu-only"])
    assert "no GPU inventory" in refused["cpu-only"]
    assert refused[NARROW[1]] == "gpupool: 2 GPUs needed, node has 1"
    prioritized = ext.prioritize({"Pod": pod("2"), "Nodes": {"items": items[2:]}}).items()
    assert [h["Host"] for h in prioritized] == [WIDE[3]]


@pytest.mark.parametrize("names, error", [
    (b'"wide-0"', "must be a list of node names"),
    (b'{"a":1}', "must be a list of node names"),
    (b'["wide-0",7]', "holds something that is not a node name"),
    (b'["wide-0",""]', "holds something that is not a node name"),
    (b'["wide-0",null]', "holds something that is not a node name"),
    (b'["wide-0",]', "not valid JSON"),
    (b'["wide-0"', "not valid JSON"),
])
def test_malformed_node_names_get_a_clear_error(ext: Extender, names: bytes, error: str) -> None:
    answer = msgspec.json.decode(ext.filter_json(body(pod("1"), names)))
    assert error in answer["Error"] and answer["NodeNames"] is None
    assert ext.prioritize_json(body(pod("1"), names)) == b"[]"


@pytest.mark.parametrize("raw, error", [
    (b"[1, 2]", "must be a JSON object, got list"),
    (b'{"Pod": 7, "NodeNames": []}', "Pod is missing or not an object"),
    (b'{"NodeNames": ["a"]}', "Pod is missing or not an object"),
    (b'{"Pod": {}, "NodeNames": null}', "neither NodeNames nor Nodes"),
    (b'{"Pod": {"a": "\xff"}, "NodeNames": []}', "not valid JSON"),
])
def test_malformed_bodies_keep_their_error_texts(ext: Extender, raw: bytes, error: str) -> None:
    assert error in msgspec.json.decode(ext.filter_json(raw))["Error"]


def test_warm_lays_out_the_name_table_the_first_filter_then_uses(
        ext: Extender, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[int] = []
    real = nodenames.NameTable

    def counted(names: list[str], index: dict[str, int]) -> nodenames.NameTable:
        built.append(len(names))
        return real(names, index)

    monkeypatch.setattr("gpupool.extender.service.NameTable", counted)
    ext.warm()
    assert built == [len(WIDE + NARROW)]
    answer = msgspec.json.decode(ext.filter_json(body(pod("1"), msgspec.json.encode(WIDE))))
    assert answer["NodeNames"] == WIDE and built == [len(WIDE + NARROW)]  # not built again
