"""Frames: how the stub provider and gpupool's terminators delimit their messages.

One frame (docs/remote.md, "Frames")::

    u32 header length | u32 payload length | header | payload      (big-endian lengths)

The header is a UTF-8 JSON object of at most ``MAX_HEADER`` bytes that names an
``op`` (a request) or says ``ok`` (an answer); the payload is raw bytes (data written
or read), at most the reader's ``max_payload``. A reader refuses, with a
``FrameError`` whose ``code`` names what went wrong:

* ``frame-too-large`` — a length over its limit (nothing more is read: the sender is
  told, and the connection closed);
* ``malformed-frame`` — a header that is not a JSON object (its lengths were
  good, so the connection may go on);
* ``timeout`` — a frame begun but not finished within ``frame_s`` (a slow or stuck
  sender does not hold a connection for ever), or no frame within ``idle_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from dataclasses import dataclass
from typing import Any

PREFIX = struct.Struct("!II")
MAX_HEADER = 16 * 1024


class FrameError(Exception):
    """A frame that cannot be read; ``code`` names why, ``fatal``: close the connection."""

    def __init__(self, code: str, message: str, fatal: bool = True):
        super().__init__(message)
        self.code = code
        self.fatal = fatal


@dataclass(frozen=True, slots=True)
class Frame:
    header: dict[str, Any]
    payload: bytes = b""


@dataclass(frozen=True, slots=True)
class Limits:
    """What a reader accepts: payload size, time to finish a frame, time between frames."""

    max_payload: int = 0
    frame_s: float = 30.0
    idle_s: float | None = None


def encode(header: dict[str, Any], payload: bytes = b"") -> bytes:
    head = json.dumps(header, separators=(",", ":")).encode()
    return PREFIX.pack(len(head), len(payload)) + head + payload


def error(code: str, message: str) -> dict[str, Any]:
    """The answer to a request that cannot be served."""
    return {"ok": False, "error": code, "message": message}


async def read(reader: asyncio.StreamReader, limits: Limits) -> Frame | None:
    """The next frame, or None at a clean end of stream (between frames)."""
    try:
        prefix = await asyncio.wait_for(reader.readexactly(PREFIX.size), limits.idle_s)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise FrameError("malformed-frame", "the stream ended inside a frame") from None
        return None
    except TimeoutError:
        raise FrameError("timeout", f"no frame within {limits.idle_s:g} s") from None
    head_len, payload_len = PREFIX.unpack(prefix)
    if head_len > MAX_HEADER:
        raise FrameError("frame-too-large", f"a header of {head_len} bytes (at most "
                         f"{MAX_HEADER})")
    if payload_len > limits.max_payload:
        raise FrameError("frame-too-large", f"a payload of {payload_len} bytes (at most "
                         f"{limits.max_payload})")
    try:
        body = await asyncio.wait_for(reader.readexactly(head_len + payload_len),
                                      limits.frame_s)
    except asyncio.IncompleteReadError:
        raise FrameError("malformed-frame", "the stream ended inside a frame") from None
    except TimeoutError:
        raise FrameError("timeout", f"a frame of {head_len + payload_len} bytes was not "
                         f"finished within {limits.frame_s:g} s") from None
    return Frame(_header(body[:head_len]), body[head_len:])


def _header(raw: bytes) -> dict[str, Any]:
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FrameError("malformed-frame", f"the header is not JSON ({exc})",
                         fatal=False) from None
    except (ValueError, RecursionError):  # a number too long, arrays nested too deeply
        raise FrameError("malformed-frame", "the header is JSON no reader takes (a number of "
                         "thousands of digits, or nesting too deep)", fatal=False) from None
    if not isinstance(header, dict):
        raise FrameError("malformed-frame", "the header is not a JSON object", fatal=False)
    return header


async def send(writer: asyncio.StreamWriter, header: dict[str, Any],
               payload: bytes = b"") -> None:
    writer.write(encode(header, payload))
    await writer.drain()


def whole(header: dict[str, Any], name: str, low: int = 0, high: int | None = None) -> int:
    """Field ``name`` of a request: a whole number from ``low`` (to ``high``)."""
    value = header.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (
            high is not None and value > high):
        bound = f" from {low} to {high}" if high is not None else f" of at least {low}"
        raise FrameError("bad-request", f"{name!r} must be a whole number{bound}, got "
                         f"{value!r}", fatal=False)
    return value


async def close(writer: asyncio.StreamWriter) -> None:
    """Close quietly (the peer may be gone already)."""
    writer.close()
    with contextlib.suppress(OSError, TimeoutError):
        await asyncio.wait_for(writer.wait_closed(), 2.0)
