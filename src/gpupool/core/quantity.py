"""Kubernetes resource quantities (``10Gi``, ``500m``, ``1.5e3``) as exact fractions."""

from __future__ import annotations

import re
from fractions import Fraction
from functools import lru_cache

from gpupool.core.errors import QuantityError

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_PATTERN = re.compile(
    r"^(?P<sign>[+-]?)(?P<num>\d+(?:\.\d*)?|\.\d+)"
    r"(?:(?P<exp>[eE][+-]?\d+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$",
    re.ASCII,  # digits are 0-9 only, as Kubernetes reads them (not "١", "٣")
)
_MAX_LEN = 64


def parse_quantity(text: str | int | float) -> Fraction:
    """Parse a Kubernetes quantity exactly; raise ``QuantityError`` with the reason."""
    if isinstance(text, bool):
        raise QuantityError(f"quantity must be a number or string, not {text!r}")
    if isinstance(text, int):
        return Fraction(text)
    if isinstance(text, float):
        if text != text or text in (float("inf"), float("-inf")):
            raise QuantityError(f"quantity {text!r} is not finite")
        return Fraction(str(text))
    if not isinstance(text, str):
        raise QuantityError(f"quantity must be a number or string, not {type(text).__name__}")
    return _parse_text(text)


@lru_cache(maxsize=4096)
def _parse_text(text: str) -> Fraction:
    """A quantity string parsed (remembered: a cluster's pods repeat a few dozen texts,
    "2", "8Gi", "10240", and their Fractions are immutable; errors are not remembered)."""
    s = text.strip()
    if not s or len(s) > _MAX_LEN:
        raise QuantityError(f"quantity {text!r} is empty or longer than {_MAX_LEN} characters")
    match = _PATTERN.match(s)
    if match is None:
        raise QuantityError(
            f"quantity {text!r} is not a Kubernetes quantity (examples: 4, 500m, 10Gi, 1.5e3)"
        )
    value = Fraction(match["num"])
    if match["exp"]:
        exponent = int(match["exp"][1:])
        if abs(exponent) > 30:
            raise QuantityError(f"quantity {text!r} has an absurd exponent")
        value *= Fraction(10) ** exponent
    else:
        suffix = match["suffix"] or ""
        value *= _BINARY[suffix] if suffix in _BINARY else _DECIMAL[suffix]
    return -value if match["sign"] == "-" else value


def to_mib(text: str | int | float) -> int:
    """A byte quantity rounded up to whole MiB (``10Gi`` -> 10240)."""
    value = parse_quantity(text)
    if value < 0:
        raise QuantityError(f"memory quantity {text!r} is negative")
    mib, rest = divmod(value, 2**20)
    return int(mib) + (1 if rest else 0)


def to_int(text: str | int | float, what: str = "quantity") -> int:
    """A quantity that must be a non-negative whole number (extended resources)."""
    value = parse_quantity(text)
    if value < 0 or value.denominator != 1:
        raise QuantityError(f"{what} {text!r} must be a non-negative whole number")
    return int(value)


def to_milli(text: str | int | float) -> int:
    """A CPU quantity in milli-units, rounded up (``1.5`` -> 1500, ``250m`` -> 250)."""
    value = parse_quantity(text) * 1000
    if value < 0:
        raise QuantityError(f"quantity {text!r} is negative")
    return int(value) + (1 if value.denominator != 1 else 0)
