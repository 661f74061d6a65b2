"""``deeper_than`` agrees with the depth of the decoded value for any JSON, brackets and
escapes inside strings included, and counts unclosed brackets as open."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.contract.jsondepth import MAX_DEPTH, deeper_than

TRICKY = st.sampled_from(['[', ']', '{', '}', '"', '\\', '\\"', '\\\\', '""', '"[', '\\u005b'])
TEXT = st.lists(st.one_of(TRICKY, st.text(max_size=3)), max_size=4).map("".join)
VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=40)


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


@settings(max_examples=400)
@given(value=VALUES, limit=st.integers(0, 12), indent=st.sampled_from([None, 1]))
def test_the_depth_found_is_the_decoded_values(value: Any, limit: int,
                                               indent: int | None) -> None:
    body = json.dumps(value, indent=indent).encode()
    assert deeper_than(body, limit) == (depth(value) > limit)


@pytest.mark.parametrize("depth_", [MAX_DEPTH, MAX_DEPTH + 1, 100_000])
def test_nesting_around_the_limit(depth_: int) -> None:
    body = b'{"a":' + b"[" * (depth_ - 1) + b"]" * (depth_ - 1) + b"}"
    assert deeper_than(body) == (depth_ > MAX_DEPTH)


@pytest.mark.parametrize("body", [b"[" * (MAX_DEPTH + 1), b'{"a":' * (MAX_DEPTH + 1),
                                  b"[" * MAX_DEPTH + b"[]" * 5 + b"{"])
def test_brackets_never_closed_count_as_open(body: bytes) -> None:
    assert deeper_than(body)


def test_brackets_inside_strings_do_not_count() -> None:
    body = json.dumps({"a": "[" * 10_000, "b": ["\\\"[{" * 1000]}).encode()
    assert not deeper_than(body)
    assert deeper_than(bytearray(json.dumps([[["x"]]]).encode()), 2)
