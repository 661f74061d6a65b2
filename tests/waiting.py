"""Waiting in tests for what threads of their own bring: watches feeding a cache, an
agent's or controller's loop."""

from __future__ import annotations

import time
from collections.abc import Callable

PATIENCE_S = 30.0
"""How long a test waits by default for something that should happen soon: generous, so a
loaded CI machine does not fail a test; a wait ends as soon as its condition holds, so a
passing test does not pay for it."""


def wait_for(check: Callable[[], object], timeout_s: float = PATIENCE_S) -> bool:
    """Poll ``check`` until it holds or ``timeout_s`` has passed; whether it held."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return bool(check())
