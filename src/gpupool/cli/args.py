"""Argument types several subcommands share."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TypeVar

N = TypeVar("N", int, float)


def bounded(kind: type[N], low: float, high: float = math.inf, *, above: bool = False
            ) -> Callable[[str], N]:
    """An argparse type: a number of ``kind`` (``int``: whole) from ``low`` (``above``:
    more than ``low``) to ``high``, refused with the bounds in the message."""
    noun = "a whole number" if kind is int else "a number"
    if high == math.inf:
        limits = f"above {low:g}" if above else f"of at least {low:g}"
    else:
        limits = f"above {low:g} and at most {high:g}" if above else \
            f"from {low:g} to {high:g}"

    def parse(text: str) -> N:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {noun}, got {text!r}") from None
        if not (low < value if above else low <= value) or not value <= high:  # NaN: False
            raise argparse.ArgumentTypeError(f"expected {noun} {limits}, got {text}")
        return value
    return parse


def weight(text: str) -> tuple[str, float]:
    """``--weight NAME=NUMBER`` (a policy weight, e.g. ``fgd-balance.lambda=0.5``)."""
    name, _, value = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        number = None
    if not name.strip() or number is None:
        raise argparse.ArgumentTypeError(
            f"--weight takes NAME=NUMBER (e.g. fgd-balance.lambda=0.5), got {text!r}")
    return name.strip(), number
