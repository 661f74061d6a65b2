"""Strict YAML and merge keys (``<<``) read as YAML reads them: the map's own keys win,
then the maps merged earlier; a map that merges itself is a problem with its place; an
anchor merged many times is worked out once."""

from __future__ import annotations

import pytest
import yaml

from gpupool.contract.yamlcheck import ANYTHING, NUMBER, Map, YamlProblems, check_text

GPU = Map({"model": ANYTHING, "healthy": NUMBER})
SHAPE = Map({"a": ANYTHING, "b": ANYTHING, "gpu": GPU}, others=Map({}, others=ANYTHING))


def problems(text: str) -> list[str]:
    try:
        check_text(text, "f.yaml", SHAPE, yaml.compose, yaml.YAMLError)
    except YamlProblems as exc:
        return [str(p) for p in exc.problems]
    return []


BAD, GOOD = "a: &a {healthy: lots}\n", "b: &b {healthy: 1}\n"


@pytest.mark.parametrize(("gpu", "checked"), [
    ("{<<: [*b, *a]}", 1),        # the earlier map merged in wins
    ("{<<: *a, healthy: 2}", 2),  # the map's own key wins over every merged map
    ("{<<: [*a, *b]}", "lots"),   # ... so here the bad value is the one read
])
def test_merged_keys_follow_yamls_precedence(gpu: str, checked: object) -> None:
    text = BAD + GOOD + f"gpu: {gpu}\n"
    assert yaml.safe_load(text)["gpu"]["healthy"] == checked
    found = problems(text)
    if checked == "lots":
        assert found == ["f.yaml:1:17: gpu.healthy: expected a number, got a string 'lots'"]
    else:
        assert found == []


def test_a_key_given_twice_among_a_maps_own_keys_is_still_a_problem() -> None:
    found = problems(GOOD + "gpu: {<<: *b, model: T4, model: A10}\n")
    assert len(found) == 1 and "key 'model' appears twice in gpu" in found[0]


def test_maps_that_merge_each_other_in_a_ring_are_a_problem_not_a_crash() -> None:
    found = problems("gpu: &g {<<: {<<: *g, model: T4}}\n")
    assert found and all(p.startswith("f.yaml:1:6:") and "merges itself" in p for p in found)


def test_an_anchor_merged_many_times_over_many_levels_is_checked_once() -> None:
    # 40 levels, each merging the previous level nine times: 9**40 paths if not remembered
    lines = ["l0: &l0 {healthy: 1}"]
    lines += [f"l{i}: &l{i} {{<<: [{', '.join([f'*l{i - 1}'] * 9)}], model: m{i}}}"
              for i in range(1, 41)]
    lines.append("gpu: {<<: *l40, healthy: nope}")
    found = problems("\n".join(lines) + "\n")
    assert len(found) == 1 and "gpu.healthy" in found[0]
