"""Argument types several subcommands share."""

from __future__ import annotations

import argparse


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
