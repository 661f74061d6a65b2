"""The argument types the subcommands share: bounded numbers say what they expected."""

from __future__ import annotations

import argparse

import pytest

from gpupool.cli.args import bounded


@pytest.mark.parametrize("kind, low, high, above, text, value", [
    (float, 0, float("inf"), True, "0.5", 0.5),
    (float, 1, 86_400, False, "86400", 86_400.0),
    (int, 1, float("inf"), False, "7", 7),
])
def test_numbers_within_bounds_are_taken(kind: type, low: float, high: float, above: bool,
                                         text: str, value: float) -> None:
    assert bounded(kind, low, high, above=above)(text) == value


@pytest.mark.parametrize("kind, low, high, above, text, message", [
    (float, 0, float("inf"), True, "0", "expected a number above 0, got 0"),
    (float, 0, float("inf"), True, "nan", "expected a number above 0, got nan"),
    (float, 1, 86_400, False, "1e9", "expected a number from 1 to 86400, got 1e9"),
    (float, 1, 86_400, False, "soon", "expected a number, got 'soon'"),
    (int, 1, float("inf"), False, "1.5", "expected a whole number, got '1.5'"),
    (int, 1, float("inf"), False, "0", "expected a whole number of at least 1, got 0"),
])
def test_numbers_out_of_bounds_are_refused_saying_what_was_expected(
        kind: type, low: float, high: float, above: bool, text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=f"^{message}$"):
        bounded(kind, low, high, above=above)(text)
