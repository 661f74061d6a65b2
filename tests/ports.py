"""Ports for a process a test starts, which must bind the port itself."""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 20000


def _ephemeral_low() -> int:
    """Where the kernel's range of automatic ports starts (Linux's default: 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing holds now, for a process started next to bind.

    Below the kernel's range of automatic ports, so neither a connection's local port nor
    another ``bind(("", 0))`` can take it before that process binds it (a port handed out
    by ``bind(0)`` could, on a busy machine); random, so two test runs side by side rarely
    try the same one."""
    low = _ephemeral_low()
    if low - LOWEST < 1000:  # an unusual range: fall back to what the kernel hands out
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(LOWEST, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port between {LOWEST} and {low}")
