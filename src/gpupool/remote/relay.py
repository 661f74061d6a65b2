"""Carrying a data channel's bytes between two connections, both ways, unchanged."""

from __future__ import annotations

import asyncio
import contextlib

from gpupool.remote import frames

CHUNK = 256 * 1024


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        data = await reader.read(CHUNK)
        if not data:
            return
        writer.write(data)
        await writer.drain()


async def relay(a: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                b: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
    """Copy ``a`` to ``b`` and ``b`` to ``a`` until either side ends (or fails), then close
    both (the protocols carried are request/answer: one side leaving ends the exchange)."""
    pumps = [asyncio.create_task(_pump(a[0], b[1])), asyncio.create_task(_pump(b[0], a[1]))]
    try:
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in pumps:
            task.cancel()
        for task in pumps:
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                await task
        await frames.close(a[1])
        await frames.close(b[1])
