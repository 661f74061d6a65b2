"""Strict YAML checking: every unknown key, wrong type and missing key, with file, line,
column and the closest known key — all at once, never a traceback."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.contract.yamlcheck import (
    NUMBER,
    QUANTITY,
    TEXT,
    Map,
    OneOf,
    Problem,
    Seq,
    Shape,
    YamlProblems,
    load_text,
)

GPU = Map({"model": TEXT, "memory": QUANTITY, "healthy": NUMBER},
          required=frozenset({"model", "memory"}))
DOC = Map({"gpus": Seq(GPU), "name": TEXT, "pool": OneOf((Seq(GPU), GPU)),
           "labels": Map({}, others=TEXT)})


def check_text(text: str, file: str, shape: Shape) -> Any:
    return load_text(text, file, shape, yaml.SafeLoader, yaml.YAMLError)


def problems(text: str, shape: Shape = DOC) -> list[str]:
    try:
        check_text(text, "f.yaml", shape)
    except YamlProblems as exc:
        return [str(p) for p in exc.problems]
    return []


def test_an_unknown_key_names_file_line_column_place_and_the_closest_key() -> None:
    text = ("gpus:\n"
            "  - {model: T4, memory: 16Gi}\n"
            "  - {model: T4, memory: 16Gi}\n"
            "  - model: T4\n"
            "    memroy: 16Gi\n")
    assert problems(text) == [
        "f.yaml:4:5: gpus[2]: missing required key 'memory'",
        "f.yaml:5:5: unknown key 'memroy' in gpus[2] (did you mean 'memory'?)",
    ]


def test_every_problem_is_reported_at_once_in_file_order() -> None:
    text = ("nmae: x\n"
            "gpus:\n"
            "  - {model: [T4], memory: 16Gi}\n"
            "  - {model: T4}\n"
            "labels: {a: {b: c}}\n")
    assert problems(text) == [
        "f.yaml:1:1: unknown key 'nmae' in the top level (did you mean 'name'?)",
        "f.yaml:3:13: gpus[0].model: expected a string, got a list",
        "f.yaml:4:5: gpus[1]: missing required key 'memory'",
        "f.yaml:5:13: labels.a: expected a string, got a map",
    ]


def test_an_unknown_key_with_nothing_close_lists_the_known_keys() -> None:
    assert problems("gpus: [{model: T4, memory: 1Gi, zzz: 1}]") == [
        "f.yaml:1:33: unknown key 'zzz' in gpus[0] (known: healthy, memory, model)"]


def test_a_scalar_of_the_wrong_kind_is_named_with_its_value() -> None:
    assert problems("name: 12\ngpus: [{model: T4, memory: 1Gi, healthy: yes}]") == [
        "f.yaml:1:7: name: expected a string, got a whole number '12'",
        "f.yaml:2:42: gpus[0].healthy: expected a number, got true or false 'yes'",
    ]


def test_one_of_picks_the_shape_of_the_nodes_kind() -> None:
    assert problems("pool: {model: T4, memory: 1Gi}") == []
    assert problems("pool: [{model: T4, memory: 1Gi}]") == []
    assert problems("pool: [{model: T4, memroy: 1Gi}]")[1].endswith("(did you mean 'memory'?)")


def test_a_key_given_twice_is_reported_with_the_first_line() -> None:
    assert problems("name: a\ngpus: []\nname: b\n") == [
        "f.yaml:3:1: key 'name' appears twice in the top level (first at line 1)"]


def test_anchors_aliases_and_merge_keys_are_followed() -> None:
    text = (
        "gpus:\n"
        "  - &g {model: T4, memory: 1Gi}\n"
        "  - *g\n"
        "  - {<<: *g, healthy: 1}\n"
        "  - {<<: *g, colour: red}\n")
    assert problems(text) == ["f.yaml:5:14: unknown key 'colour' in gpus[3] (known: healthy, "
                              "memory, model)"]


def test_two_maps_merged_in_with_one_key_are_not_a_key_given_twice() -> None:
    text = ("a: &a {model: T4, memory: 1Gi}\n"
            "b: &b {model: A10, memory: 2Gi}\n"
            "gpus: [{<<: [*a, *b]}]\n")
    shape = Map({**DOC.fields, "a": GPU, "b": GPU})
    assert problems(text, shape) == []


def test_null_values_and_an_empty_document_are_left_to_the_reader() -> None:
    assert problems("name:\ngpus:\n") == []
    assert check_text("", "f.yaml", DOC) is None


def test_malformed_yaml_is_one_problem_at_the_parsers_mark() -> None:
    with pytest.raises(YamlProblems) as caught:
        check_text("gpus:\n  - {model: T4\n", "f.yaml", DOC)
    assert len(caught.value.problems) == 1
    assert str(caught.value).startswith("f.yaml:3:1: not valid YAML: expected ',' or '}'")


def test_two_documents_in_one_file_are_refused() -> None:
    with pytest.raises(YamlProblems, match=r"f.yaml:2:1: not valid YAML: expected a single "
                                           r"document in the stream, but found "):
        check_text("name: a\n---\nname: b\n", "f.yaml", DOC)


def test_a_file_of_the_wrong_kind_lists_fifty_problems_and_counts_the_rest() -> None:
    text = "\n".join(f"key{i}: 1" for i in range(80))
    with pytest.raises(YamlProblems) as caught:
        check_text(text, "f.yaml", DOC)
    lines = str(caught.value).splitlines()
    assert len(caught.value.problems) == 80
    assert len(lines) == 51 and lines[-1] == "... and 30 more problems"


def test_a_closed_namespace_of_an_open_map_refuses_names_it_does_not_list() -> None:
    amounts = Map({"gpupool.io/gpu": QUANTITY, "gpupool.io/gpu-memory": QUANTITY},
                  others=QUANTITY, closed=("gpupool.io/",))
    shape = Map({"limits": amounts})
    assert problems("limits: {cpu: 1, example.com/fpga: 1, gpupool.io/gpu: 1}", shape) == []
    assert problems("limits: {gpupool.io/gpu-memroy: 8192}", shape) == [
        "f.yaml:1:10: unknown key 'gpupool.io/gpu-memroy' in limits "
        "(did you mean 'gpupool.io/gpu-memory'?)"]


def test_a_typo_guard_takes_only_close_keys_for_typos() -> None:
    shape = Map({"notes": Map({"gpupool.io/mode": TEXT}, others=TEXT,
                              typos_of=("gpupool.io/mode",))})
    assert problems("notes: {gpupool.io/over-use: x, app: y}", shape) == []
    assert problems("notes: {gpupool.io/mdoe: shared}", shape) == [
        "f.yaml:1:9: unknown key 'gpupool.io/mdoe' in notes (did you mean 'gpupool.io/mode'?)"]


def test_a_problem_reads_like_a_compiler_message() -> None:
    assert str(Problem("a.yaml", 3, 7, "bad")) == "a.yaml:3:7: bad"


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet="gpus:- {}[]\n\t'\"&*!<>#|model,memory: T4 1Gi%@`", max_size=60))
def test_any_text_gives_problems_or_nothing_never_a_crash(text: str) -> None:
    try:
        check_text(text, "f.yaml", DOC)
    except YamlProblems as exc:
        assert exc.problems and all(p.line >= 1 and p.column >= 1 for p in exc.problems)
