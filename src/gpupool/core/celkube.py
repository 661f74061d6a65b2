"""The Kubernetes CEL library functions DRA device selectors use, for cel-python.

Kubernetes' DRA CEL environment is its base environment (the Kubernetes CEL libraries)
plus the ``device`` variable. Device selectors use two of those libraries; they are
given here as cel-python functions (a method call ``x.f(y)`` is the function ``f(x, y)``):

* **quantity**: ``quantity('40Gi')``, ``isQuantity(s)``, and on a quantity
  ``compareTo(q)`` (-1, 0, 1), ``isGreaterThan(q)``, ``isLessThan(q)``, ``sign()``,
  ``isInteger()``, ``asInteger()`` (an error when not an integer or beyond int64),
  ``asApproximateFloat()``, ``add(q|int)``, ``sub(q|int)``; ``==`` compares values
  (``quantity('1') == quantity('1000m')``). A device's ``capacity`` values are quantities.
* **semver**: ``semver('1.2.3')``, ``isSemver(s)``, and on a version ``major()``,
  ``minor()``, ``patch()``, ``compareTo(v)``, ``isGreaterThan(v)``, ``isLessThan(v)``,
  ``==``; precedence as Semantic Versioning 2.0 (a pre-release is lower, build metadata
  is ignored). A device's ``version`` attributes are versions.

A function given something it cannot take raises ``ValueError`` or ``TypeError``, which
cel-python turns into an evaluation error, as cel-go's library returns an error value.
``parse_message`` and ``eval_message`` turn cel-python's errors into one sentence.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from celpy import celtypes

from gpupool.core.errors import QuantityError
from gpupool.core.quantity import parse_quantity

INT64_MAX = 2**63 - 1
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)"
    r"(?:\.(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$", re.ASCII)


@dataclass(frozen=True, slots=True)
class Quantity:
    """A Kubernetes quantity as CEL sees it (exact value)."""

    value: Fraction

    def __str__(self) -> str:
        return f"quantity({self.value})"


@dataclass(frozen=True, slots=True)
class Semver:
    """A semantic version as CEL sees it."""

    major: int
    minor: int
    patch: int
    pre: tuple[int | str, ...] = ()

    def key(self) -> tuple[Any, ...]:
        """Precedence: a release ranks above its pre-releases; numeric ids below words."""
        pre = tuple((0, p, "") if isinstance(p, int) else (1, 0, p) for p in self.pre)
        return (self.major, self.minor, self.patch, not self.pre, pre)


def parse_semver(text: str) -> Semver:
    m = _SEMVER.match(text)
    if m is None:
        raise ValueError(f"{text!r} is not a semantic version (major.minor.patch)")
    pre = tuple(int(p) if p.isdigit() else p for p in (m.group(4) or "").split(".") if p)
    return Semver(int(m.group(1)), int(m.group(2)), int(m.group(3)), pre)


def _quantity(text: Any) -> Quantity:
    if not isinstance(text, str):
        raise TypeError(f"quantity() takes a string, not {type(text).__name__}")
    try:
        return Quantity(parse_quantity(str(text)))
    except QuantityError as exc:
        raise ValueError(str(exc)) from None


def _is_quantity(text: Any) -> celtypes.BoolType:
    try:
        _quantity(text)
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _semver(text: Any) -> Semver:
    if not isinstance(text, str):
        raise TypeError(f"semver() takes a string, not {type(text).__name__}")
    return parse_semver(str(text))


def _is_semver(text: Any) -> celtypes.BoolType:
    try:
        _semver(text)
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _order(a: Any, b: Any) -> int:
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        return (a.value > b.value) - (a.value < b.value)
    if isinstance(a, Semver) and isinstance(b, Semver):
        ka, kb = a.key(), b.key()
        return (ka > kb) - (ka < kb)
    raise TypeError(f"no overload compares {type(a).__name__} with {type(b).__name__}")


def _compare_to(a: Any, b: Any) -> celtypes.IntType:
    return celtypes.IntType(_order(a, b))


def _greater(a: Any, b: Any) -> celtypes.BoolType:
    return celtypes.BoolType(_order(a, b) > 0)


def _less(a: Any, b: Any) -> celtypes.BoolType:
    return celtypes.BoolType(_order(a, b) < 0)


def _q(value: Any) -> Quantity:
    if isinstance(value, Quantity):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return Quantity(Fraction(int(value)))
    raise TypeError(f"expected a quantity, not {type(value).__name__}")


def _sign(q: Any) -> celtypes.IntType:
    v = _q(q).value
    return celtypes.IntType((v > 0) - (v < 0))


def _is_integer(q: Any) -> celtypes.BoolType:
    return celtypes.BoolType(_q(q).value.denominator == 1)


def _as_integer(q: Any) -> celtypes.IntType:
    v = _q(q).value
    if v.denominator != 1 or not -INT64_MAX - 1 <= v.numerator <= INT64_MAX:
        raise ValueError(f"cannot convert value {v} to integer")
    return celtypes.IntType(v.numerator)


def _as_float(q: Any) -> celtypes.DoubleType:
    return celtypes.DoubleType(float(_q(q).value))


def _add(a: Any, b: Any) -> Quantity:
    return Quantity(_q(a).value + _q(b).value)


def _sub(a: Any, b: Any) -> Quantity:
    return Quantity(_q(a).value - _q(b).value)


def _part(name: str) -> Callable[[Any], celtypes.IntType]:
    def part(v: Any) -> celtypes.IntType:
        if not isinstance(v, Semver):
            raise TypeError(f"{name}() takes a version, not {type(v).__name__}")
        return celtypes.IntType(getattr(v, name))
    return part


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": _quantity, "isQuantity": _is_quantity, "semver": _semver,
    "isSemver": _is_semver, "compareTo": _compare_to, "isGreaterThan": _greater,
    "isLessThan": _less, "sign": _sign, "isInteger": _is_integer, "asInteger": _as_integer,
    "asApproximateFloat": _as_float, "add": _add, "sub": _sub,
    "major": _part("major"), "minor": _part("minor"), "patch": _part("patch"),
}
"""The Kubernetes library functions of DRA's CEL environment, by name."""


def parse_message(exc: BaseException) -> str:
    """cel-python's parse error is the expression with a caret: say where."""
    lines = str(exc).splitlines()
    if len(lines) >= 2 and lines[1].strip() == "^":
        return f"syntax error at character {len(lines[1]) - 1}"
    return first_line(exc)


def eval_message(exc: BaseException) -> str:
    """cel-python's evaluation error as one sentence (its args: text, class, args)."""
    args = exc.args
    text = str(args[0]) if args else type(exc).__name__
    cause = args[2] if len(args) > 2 else None
    if isinstance(cause, tuple) and cause and str(cause[0]) != text:
        text = str(cause[0]) if text == "return error for overflow" else f"{text}: {cause[0]}"
    return text[:200]


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
