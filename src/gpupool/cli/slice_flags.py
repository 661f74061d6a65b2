"""Flags the slice commands share (``slice-server``, ``slice-client``, ``slice-stub``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpupool.cli.args import bounded

PORT = bounded(int, 0, 65535)
SECONDS = bounded(float, 0, 86_400 * 7, above=True)


def endpoint(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6 address]:PORT`` for IPv6)."""
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (e.g. 10.0.3.7:14900), got "
                                         f"{text!r}")
    return host, int(port)


def add_credentials(p: argparse.ArgumentParser, who: str) -> None:
    p.add_argument("--credentials-dir", type=Path, required=True, metavar="DIR",
                   help=f"the {who}'s session credentials: tls.crt, tls.key and ca.crt (a "
                        "mounted TLS Secret), read again when they change (required)")


def add_timing(p: argparse.ArgumentParser) -> None:
    p.add_argument("--heartbeat-seconds", type=SECONDS, default=5.0, metavar="SECONDS",
                   help="how often each side sends a heartbeat (default 5)")
    p.add_argument("--heartbeat-deadline-seconds", type=SECONDS, default=20.0,
                   metavar="SECONDS",
                   help="silence after which the other side counts as gone (default 20)")
    p.add_argument("--status-address", default="0.0.0.0", metavar="ADDRESS",
                   help="address of the status endpoint for probes (default 0.0.0.0)")


def log_setup(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def on_sigterm(stop: Callable[[], Any]) -> None:
    """Run ``stop`` when the process is asked to end (SIGTERM, as kubelet does)."""
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGTERM, stop)
