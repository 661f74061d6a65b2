"""Which bytes of an HTTP/1.1 connection are a request's head (request line and headers)
and which its body, whatever the chunking the network delivers them in.

The HTTP parser (llhttp, through httptools) says *that* the head ended or the body ended,
not *where* in the bytes it was given. So ``Framing`` hands the parser the bytes in
slices cut where a phase can end, and each slice then belongs to one phase:

* between requests (``IDLE``): the empty lines llhttp skips, up to the next request's
  first byte;
* in a head (``HEAD``): up to and including the first ``CRLF CRLF`` (llhttp accepts no
  other end of a head: a bare LF is an error), and never more than the head bytes still
  allowed (``header_bytes``), so a head that has not ended by then is over the limit;
* in a body of a declared length (``LENGTH``): exactly the bytes still to come;
* in a chunked body (``CHUNKED``): up to where the body ends (``ChunkedBody`` reads the
  chunks as llhttp does), so a request pipelined behind it starts a slice; should that
  reading be lost (a size line llhttp refuses: the parser then ends the connection), up
  to the next ``CRLF CRLF``.

A body's bytes are counted, never searched: whatever they hold, a body costs one slice
per piece the network delivers (and one more where it ends). Only head bytes, chunk size
lines and a chunked body's trailer section are searched, each byte once; a chunked body
costs a step in C per chunk of up to 255 bytes and one in Python per larger chunk.

``head`` counts the bytes of the current request's head (with the empty lines before it)
and nothing else; ``over`` says it passed ``header_bytes``. The parser's callbacks
(``began``, ``headers_done``, ``completed``) move the phase; ``feed`` hands the parser
one slice at a time and accounts it once read. Pure: no I/O.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable

IDLE, HEAD, LENGTH, CHUNKED = "idle", "head", "length", "chunked"
END = b"\r\n\r\n"
BLANK = b"\r\n"
BLANKS = re.compile(rb"[\r\n]*")  # what llhttp skips before a request
HEX = re.compile(rb"[0-9A-Fa-f]*+")
MAX_CHUNK = 1 << 64  # llhttp refuses a chunk size from here ("Chunk size overflow")


@functools.cache
def chunk_run() -> re.Pattern[bytes]:
    """A run of whole chunks of 1 to 255 bytes each (zeros, one or two hex digits,
    extensions, CRLF, the data, CRLF), then the next size line if it is whole (its
    digits: group 1), matched in C: a body of tiny chunks costs about what the parser
    itself spends on it rather than a Python step per chunk. Compiled on first use (a
    few ms)."""
    def digit(value: int) -> str:
        return "[" + "".join(sorted({f"{value:x}", f"{value:X}"})) + "]"

    def chunk(size: int) -> str:
        return r"(?:;[^\r\n]*+)?\r\n.{" + str(size) + r"}\r\n"
    sizes = "|".join(
        digit(high) + "(?:" + chunk(high) + "".join("|" + digit(low) + chunk(16 * high + low)
                                                    for low in range(16)) + ")"
        for high in range(1, 16))
    line = r"(?:([0-9A-Fa-f]++)[^\n]*+\n)?"
    return re.compile(f"(?:0*+(?:{sizes}))*+{line}".encode(), re.DOTALL)


def matched(pattern: re.Pattern[bytes], data: bytes, at: int,
            stop: int | None = None) -> re.Match[bytes]:
    """``pattern``, one that matches the empty string, matched at ``at``."""
    found = pattern.match(data, at, len(data) if stop is None else stop)
    assert found is not None
    return found


def past_end(tail: bytes, data: bytes, at: int, stop: int) -> int:
    """Just past the first END in ``tail + data[at:stop]`` (``tail``: at most 3 bytes
    read before ``at``), as an index of ``data``; -1 when there is none."""
    if tail:
        across = (tail + data[at:min(at + 3, stop)]).find(END)
        if across >= 0:
            return at + across + len(END) - len(tail)
    found = data.find(END, at, stop)
    return found + len(END) if found >= 0 else -1


class ChunkedBody:
    """Where a chunked body ends, read as llhttp reads it (RFC 9112, 7.1): each chunk's
    size line (hex digits, then extensions up to its LF), its data and the CRLF after it
    skipped by count, never searched; after the last chunk (size 0), the trailer
    section up to the first CRLF CRLF (the last chunk's line end included).

    It reads what llhttp accepts; what llhttp refuses (no digits, a size of 2**64 or
    more) makes it ``lost``, as does reading past the body's end: the parser closes the
    connection on the former, and the caller falls back to cutting at every END."""

    def __init__(self) -> None:
        self._size = 0  # the size line being read, in its digits so far
        self._digits = False  # some of its digits were read
        self._in_line = False  # its digits are read, the rest of it (to LF) is not
        self._left = 0  # chunk data (with its CRLF) still to skip
        self._trailing = False  # in the trailer section
        self._tail = b""  # there: its last (up to 3) bytes read, for an END across pieces
        self.ended = False
        self.lost = False

    def through(self, data: bytes, at: int) -> int | None:
        """Read ``data[at:]``: the index just past the body's end where it ends in there,
        else ``len(data)``; None once ``lost``."""
        if self.ended:
            self.lost = True
        while at < len(data) and not self.lost:
            if self._left:
                at = self._skip(self._left, at, len(data))
            elif self._trailing:
                return self._trailers(data, at)
            elif self._digits or self._in_line:
                at = self._size_line(data, at)
            else:  # at a size line: small chunks in one step, then one larger or the last
                run = matched(chunk_run(), data, at)
                at = self._sized(int(run[1], 16), run.end(), len(data)) if run[1] else \
                    self._size_line(data, run.end())
        return None if self.lost else at

    def _size_line(self, data: bytes, at: int) -> int:
        """Read a size line that may not be whole in ``data``; where reading stopped."""
        if not self._in_line:
            digits = matched(HEX, data, at)
            if digits[0]:
                if self._size and len(digits[0]) > 16:
                    self.lost = True
                    return at
                self._size = self._size << 4 * len(digits[0]) | int(digits[0], 16)
                self._digits = True
            at = digits.end()
            if at == len(data):
                return at
            self._in_line, self.lost = True, not self._digits
        lf = data.find(b"\n", at)
        return len(data) if lf < 0 else self._sized(self._size, lf + 1, len(data))

    def _sized(self, size: int, at: int, stop: int) -> int:
        """A size line ended just before ``at``: where reading its chunk (data and CRLF)
        stops, at most at ``stop``."""
        self._size, self._digits, self._in_line = 0, False, False
        if size >= MAX_CHUNK:
            self.lost = True
        elif size:
            return self._skip(size + len(BLANK), at, stop)
        else:
            self._trailing, self._tail = True, BLANK
        return at

    def _skip(self, count: int, at: int, stop: int) -> int:
        """Skip ``count`` bytes from ``at``, at most to ``stop``: where it stopped."""
        step = min(count, stop - at)
        self._left = count - step
        return at + step

    def _trailers(self, data: bytes, at: int) -> int:
        end = past_end(self._tail, data, at, len(data))
        if end >= 0:
            self.ended = True
            return end
        self._tail = (self._tail + data[max(at, len(data) - 3):])[-3:]
        return len(data)



class Framing:
    """Head and body accounting of one HTTP/1.1 connection."""

    def __init__(self, header_bytes: int):
        self.header_bytes = header_bytes
        self.phase = IDLE
        self.head = 0  # bytes of the current head so far
        self.left = 0  # LENGTH: body bytes still to come
        self.chunks = ChunkedBody()  # CHUNKED: where the body ends
        self._tail = b""  # the last (up to 3) bytes of this phase, for an END across slices
        self._moved = False  # the parser changed phase during the slice being fed

    # -- the parser's callbacks ------------------------------------------------------------------
    def began(self) -> None:
        self.phase, self._moved = HEAD, True

    def headers_done(self, headers: Iterable[tuple[bytes, bytes]]) -> None:
        """The head ended; ``headers`` (lower-case names) say what body follows."""
        self._moved = True
        length = None
        for name, value in headers:
            if name == b"content-length":
                length = int(value) if value.strip().isdigit() else 0
            elif name == b"transfer-encoding":
                self.phase, self._tail, self.chunks = CHUNKED, b"", ChunkedBody()
                return
        self.phase, self.left, self._tail = (LENGTH, length, b"") if length else (IDLE, 0, b"")

    def completed(self) -> None:
        self.phase, self.head, self.left, self._tail, self._moved = IDLE, 0, 0, b"", True

    # -- slicing ---------------------------------------------------------------------------------
    def feed(self, data: bytes, parse: Callable[[memoryview], object],
             stopped: Callable[[], bool] = lambda: False) -> bool:
        """Hand ``data`` to ``parse`` slice by slice (until ``stopped``); False once a head
        is over ``header_bytes`` (the rest is not parsed)."""
        view, at = memoryview(data), 0
        while at < len(data) and not stopped():
            end = self.cut(data, at)
            if end == at:
                return False
            piece = view[at:end]
            parse(piece)
            self.fed(piece)
            if self.over:
                return False
            at = end
        return True

    def cut(self, data: bytes, at: int) -> int:
        """Where the slice of ``data`` starting at ``at`` ends (exclusive); a chunked
        body's bytes up to there are taken as read (the slice is handed to the parser)."""
        if self.phase == LENGTH:
            return min(len(data), at + self.left)
        if self.phase == IDLE:
            blank = matched(BLANKS, data, at, at + self.room()).end()
            return blank if blank > at else self._to_end(data, at, at + self.room())
        if self.phase == HEAD:
            return self._to_end(data, at, at + self.room())
        end = self.chunks.through(data, at)
        return end if end is not None else self._to_end(data, at, len(data))

    def room(self) -> int:
        """Head bytes still allowed."""
        return max(0, self.header_bytes - self.head)

    def _to_end(self, data: bytes, at: int, stop: int) -> int:
        """Just past the first END in ``data[at:stop]`` (one that began in the previous
        slice included), else ``stop`` (at most the data's end)."""
        stop = min(stop, len(data))
        end = past_end(self._tail, data, at, stop)
        return end if end >= 0 else stop

    def fed(self, piece: bytes | memoryview) -> None:
        """Account ``piece``, the slice the parser has just read."""
        size = len(piece)
        if not self._moved:
            if self.phase in (IDLE, HEAD):
                self.head += size
            elif self.phase == LENGTH:
                self.left -= size
            self._tail = (self._tail + bytes(piece[-3:]))[-3:]
        elif self.phase == HEAD:  # a request began in this slice: its bytes are head
            self.head += size
            self._tail = bytes(piece[-3:])
        self._moved = False

    @property
    def over(self) -> bool:
        """The head is longer than ``header_bytes`` (it has not ended within them)."""
        return self.phase in (IDLE, HEAD) and self.head >= self.header_bytes
