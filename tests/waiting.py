"""Waiting in tests for what threads of their own bring: watches feeding a cache, an
agent's or controller's loop."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(check: Callable[[], object], timeout_s: float = 10.0) -> bool:
    """Poll ``check`` until it holds or ``timeout_s`` has passed; whether it held."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return bool(check())
