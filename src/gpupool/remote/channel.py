"""What the sidecar and the slice server say to each other over mutual TLS.

Every connection the sidecar opens to the slice server starts, once TLS is up and each
side has checked the other's identity, with one **hello** frame (``frames``)::

    sidecar -> server   {"op": "hello", "protocol": 1, "channel": "data" | "control"}
    server -> sidecar   {"ok": true, "slice": {...}}     or an error, then close

A ``data`` channel then carries the provider's own bytes, unchanged, both ways. A
``control`` channel carries **heartbeats both ways**: each side sends
``{"op": "heartbeat", "seq": n}`` every ``interval_s`` and counts the other side lost
when nothing came for ``deadline_s``; the server says ``{"op": "released", "reason":
...}`` before it closes the channels of a slice it released.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpupool.remote import frames
from gpupool.remote.frames import FrameError

PROTOCOL = 1
CHANNELS = ("data", "control")
HELLO = frames.Limits(max_payload=0, frame_s=10.0, idle_s=10.0)


@dataclass(frozen=True, slots=True)
class Timing:
    """Heartbeat period and the silence after which a peer counts as gone."""

    interval_s: float = 5.0
    deadline_s: float = 20.0


class Liveness:
    """When a peer was last heard from (time passed in: a monotonic clock)."""

    def __init__(self, deadline_s: float, now: float):
        self.deadline_s = deadline_s
        self.last = now

    def heard(self, now: float) -> None:
        self.last = max(self.last, now)

    def age(self, now: float) -> float:
        return max(0.0, now - self.last)

    def past(self, now: float) -> bool:
        return self.age(now) > self.deadline_s


def hello(channel: str) -> dict[str, Any]:
    return {"op": "hello", "protocol": PROTOCOL, "channel": channel}


def channel_of(header: dict[str, Any]) -> str:
    """The channel a hello asks for; ``FrameError`` (``bad-request``) for anything else."""
    if header.get("op") != "hello":
        raise FrameError("bad-request", f"the first frame must be a hello, got op "
                         f"{header.get('op')!r}")
    if header.get("protocol") != PROTOCOL:
        raise FrameError("bad-request", f"protocol {header.get('protocol')!r} is not spoken "
                         f"here (this server speaks {PROTOCOL})")
    channel = header.get("channel")
    if channel not in CHANNELS:
        raise FrameError("bad-request", f"unknown channel {channel!r} (data or control)")
    return str(channel)


class Released(Exception):
    """The server released the slice; the message says why."""


async def heartbeats(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     timing: Timing, heard: Callable[[], None],
                     clock: Callable[[], float] = time.monotonic) -> str:
    """Send and expect heartbeats until the peer is silent past the deadline or the
    stream ends (the sentence returned says which); ``Released`` when the server says so."""
    sender = asyncio.create_task(_beat(writer, timing.interval_s))
    limits = frames.Limits(max_payload=0, frame_s=timing.deadline_s,
                           idle_s=timing.deadline_s)
    try:
        while True:
            if sender.done():
                return f"heartbeats could not be sent ({_why(sender)})"
            try:
                frame = await frames.read(reader, limits)
            except FrameError as exc:
                if exc.code == "timeout":
                    return f"no heartbeat for {timing.deadline_s:g} s"
                if exc.fatal:
                    return f"bad control frame: {exc}"
                continue
            except (ConnectionError, OSError) as exc:
                return f"control channel broken ({exc})"
            if frame is None:
                return "control channel closed by the peer"
            op = frame.header.get("op")
            if op == "heartbeat":
                heard()
            elif op == "released":
                raise Released(str(frame.header.get("reason", "released")))
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
            await sender


async def _beat(writer: asyncio.StreamWriter, interval_s: float) -> None:
    seq = 0
    while True:
        seq += 1
        await frames.send(writer, {"op": "heartbeat", "seq": seq})
        await asyncio.sleep(interval_s)


def _why(task: asyncio.Task[None]) -> str:
    exc = task.exception() if not task.cancelled() else None
    if exc is None:
        return "stopped"
    return str(exc) or type(exc).__name__
