"""Strict YAML and merge keys (``<<``): what is checked is what the loader loads.

PyYAML releases disagree on which merged map gives a key that several of them hold
(6.0.3 keeps the first, as the YAML merge spec says; 6.0.4 mostly keeps the last), so
these tests never assume an order: they ask the installed PyYAML and require the checker
to report a problem exactly when the value the loader returns is bad."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.contract.yamlcheck import ANYTHING, NUMBER, Map, YamlProblems, load_text

GPU = Map({"model": ANYTHING, "healthy": NUMBER})
SHAPE = Map({"a": ANYTHING, "b": ANYTHING, "gpu": GPU}, others=Map({}, others=ANYTHING))


def load(text: str, shape: Map = SHAPE) -> tuple[Any, list[str]]:
    """(the document, []) or (None, the problems)."""
    try:
        return load_text(text, "f.yaml", shape, yaml.SafeLoader, yaml.YAMLError), []
    except YamlProblems as exc:
        return None, [str(p) for p in exc.problems]


BAD, GOOD = "a: &a {healthy: lots}\n", "b: &b {healthy: 1}\n"


@pytest.mark.parametrize("gpu", ["{<<: [*b, *a]}", "{<<: [*a, *b]}", "{<<: *a, healthy: 2}",
                                 "{<<: *b, <<: *a}", "{<<: *a, <<: *b}"])
def test_the_merged_value_checked_is_the_one_the_loader_returns(gpu: str) -> None:
    text = BAD + GOOD + f"gpu: {gpu}\n"
    loaded = yaml.safe_load(text)["gpu"]["healthy"]
    doc, found = load(text)
    if loaded == "lots":
        assert found == ["f.yaml:1:17: gpu.healthy: expected a number, got a string 'lots'"]
    else:
        assert found == [] and doc["gpu"]["healthy"] == loaded


def test_the_document_returned_is_the_one_the_loader_builds() -> None:
    text = GOOD + "gpu: {<<: *b, model: T4}\nextra: {<<: *b}\n"
    doc, found = load(text)
    assert found == [] and doc == yaml.safe_load(text)


def test_a_key_given_twice_among_a_maps_own_keys_is_still_a_problem() -> None:
    _, found = load(GOOD + "gpu: {<<: *b, model: T4, model: A10}\n")
    assert len(found) == 1 and "key 'model' appears twice in gpu" in found[0]


def test_maps_that_merge_each_other_in_a_ring_are_a_problem_not_a_crash() -> None:
    _, found = load("gpu: &g {<<: {<<: *g, model: T4}}\n")
    assert found and all(p.startswith("f.yaml:1:6:") and "merges itself" in p for p in found)


def test_a_merge_of_something_other_than_a_map_is_the_loaders_error_with_its_place() -> None:
    _, found = load("gpu: {<<: [1, 2]}\n")
    assert len(found) == 1 and found[0].startswith("f.yaml:1:12: not valid YAML: ")
    assert "expected a mapping for merging" in found[0]


def test_an_anchor_merged_many_times_over_many_levels_is_checked_once() -> None:
    # 40 levels, each merging the previous level nine times: 9**40 paths if not remembered
    lines = ["l0: &l0 {healthy: 1}"]
    lines += [f"l{i}: &l{i} {{<<: [{', '.join([f'*l{i - 1}'] * 9)}], model: m{i}}}"
              for i in range(1, 41)]
    lines.append("gpu: {<<: *l40, healthy: nope}")
    _, found = load("\n".join(lines) + "\n")
    assert len(found) == 1 and "gpu.healthy" in found[0]


# -- property: the checker's view of a document is the loader's ------------------------------
# Keys of one and of several letters: PyYAML 6.0.4 de-duplicates merged keys by the
# identity of the key's string, which CPython shares for one-letter strings only.
KEYS = st.sampled_from(["h", "m", "healthy", "model", "memory"])
VALUES = st.sampled_from(["1", "2.5", "lots", "x"])
MAPS = st.dictionaries(KEYS, VALUES, min_size=1, max_size=3)


@st.composite
def documents(draw: st.DrawFn) -> str:
    bases = draw(st.lists(MAPS, min_size=1, max_size=4))
    lines = [f"base{i}: &base{i} {{{', '.join(f'{k}: {v}' for k, v in m.items())}}}"
             for i, m in enumerate(bases)]
    picks = draw(st.lists(st.integers(0, len(bases) - 1), min_size=1, max_size=4))
    if draw(st.booleans()):
        merges = [f"<<: [{', '.join(f'*base{i}' for i in picks)}]"]
    else:
        merges = [f"<<: *base{i}" for i in picks]
    own = draw(st.dictionaries(KEYS, VALUES, max_size=2))
    body = merges + [f"{k}: {v}" for k, v in own.items()]
    lines.append(f"target: {{{', '.join(draw(st.permutations(body)))}}}")
    return "\n".join(lines) + "\n"


NUMBERS = Map({"target": Map({}, others=NUMBER)}, others=ANYTHING)


@settings(max_examples=300, deadline=None)
@given(documents())
def test_the_checker_reports_a_key_exactly_when_the_loaded_value_is_bad(text: str) -> None:
    loaded = yaml.safe_load(text)
    doc, found = load(text, NUMBERS)
    bad = sorted(f"target.{key}" for key, value in loaded["target"].items()
                 if not isinstance(value, (int, float)))
    reported = sorted(p.split(": ")[1] for p in found)
    assert reported == bad
    if not bad:
        assert doc == loaded
