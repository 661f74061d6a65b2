"""Review: strict YAML and merge keys (``<<``).

``yamlcheck._pairs`` splices merged maps in; it once did so recursively and without
memory, so that:

* a map that merges itself (``&a {<<: *a}``, which PyYAML composes as a cycle) recurses
  until Python's ``RecursionError`` — a traceback, not the ``file:line:col`` problem the
  module promises;
* keys that several merged maps share are reported as "appears twice", though the loader
  reads them as one key (which map's value it keeps depends on the PyYAML release).
"""

from __future__ import annotations

import pytest
import yaml

from gpupool.contract.yamlcheck import ANYTHING, Map, YamlProblems, load_text

SHAPE = Map({}, others=Map({}, others=ANYTHING))


def checked(text: str) -> None:
    load_text(text, "f.yaml", SHAPE, yaml.SafeLoader, yaml.YAMLError)


def test_a_map_that_merges_itself_is_a_problem_with_its_place_not_a_crash() -> None:
    with pytest.raises(YamlProblems, match=r"f\.yaml:1:"):
        checked("a: &a {<<: *a}\n")


def test_keys_that_merged_maps_share_are_not_duplicates_as_yaml_reads_them() -> None:
    text = "b1: &b1 {x: 1}\nb2: &b2 {x: 2}\nm: {<<: [*b1, *b2], y: 1}\n"
    assert yaml.safe_load(text)["m"]["y"] == 1  # valid YAML: one x, from one of the maps
    checked(text)
