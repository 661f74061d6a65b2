"""Kubernetes quantities: exact parsing, conversions and clear errors."""

from __future__ import annotations

from fractions import Fraction

import pytest

from gpupool.core.errors import InvalidInput, QuantityError
from gpupool.core.quantity import parse_quantity, to_int, to_mib, to_milli


@pytest.mark.parametrize(("text", "value"), [
    ("4", 4), ("500m", Fraction(1, 2)), ("10Gi", 10 * 2**30), ("1Ki", 1024), ("1k", 1000),
    ("1.5e3", 1500), ("2E-3", Fraction(2, 1000)), (".5", Fraction(1, 2)), ("1.", 1),
    ("-1", -1), ("+2M", 2_000_000), ("3n", Fraction(3, 10**9)), ("7u", Fraction(7, 10**6)),
    ("1Ei", 2**60), ("2P", 2 * 10**15), (" 7 ", 7), (3, 3), (1.5, Fraction(3, 2)),
])
def test_a_quantity_parses_exactly(text: str | int | float, value: Fraction | int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(("text", "needle"), [
    ("", "empty"), ("   ", "empty"), ("x" * 65, "longer than 64"), ("abc", "not a Kubernetes"),
    ("10GiB", "not a Kubernetes"), ("1.2.3", "not a Kubernetes"), ("Gi", "not a Kubernetes"),
    ("1 Gi", "not a Kubernetes"), ("1e99", "absurd exponent"), (True, "number or string"),
    (None, "number or string"), ([1], "number or string"), (float("nan"), "not finite"),
    (float("inf"), "not finite"),
], ids=["empty", "blank", "too long", "letters", "GiB suffix", "two points", "no number",
        "space before suffix", "huge exponent", "bool", "None", "list", "NaN", "infinity"])
def test_a_bad_quantity_says_why(text: object, needle: str) -> None:
    with pytest.raises(QuantityError, match=needle):
        parse_quantity(text)  # type: ignore[arg-type]


def test_a_quantity_error_is_invalid_input() -> None:
    with pytest.raises(InvalidInput):
        parse_quantity("nope")


@pytest.mark.parametrize(("text", "mib"), [
    ("10Gi", 10240), ("1Mi", 1), ("1.5Mi", 2), ("1", 1), ("0", 0), (2**20 * 3, 3), ("1G", 954)])
def test_memory_rounds_up_to_whole_mib(text: str | int, mib: int) -> None:
    assert to_mib(text) == mib


@pytest.mark.parametrize(("text", "milli"), [
    ("1.5", 1500), ("250m", 250), ("0.0001", 1), ("2", 2000), ("0", 0)])
def test_cpu_rounds_up_to_whole_milli_cores(text: str, milli: int) -> None:
    assert to_milli(text) == milli


@pytest.mark.parametrize(("call", "text"), [
    (to_mib, "-1Gi"), (to_milli, "-1"), (to_int, "-1"), (to_int, "1.5"), (to_int, "500m")],
    ids=["negative memory", "negative CPU", "negative count", "fractional count",
         "milli count"])
def test_conversions_refuse_what_they_cannot_represent(call: object, text: str) -> None:
    with pytest.raises(QuantityError):
        call(text)  # type: ignore[operator]


def test_whole_counts_convert_to_int() -> None:
    assert [to_int("3"), to_int(2), to_int("1k"), to_int("2e1")] == [3, 2, 1000, 20]
