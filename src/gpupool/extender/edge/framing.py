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
* in a chunked body (``CHUNKED``): up to and including the next ``CRLF CRLF`` (a
  chunked body always ends with one), so a request pipelined behind it starts a slice.

``head`` counts the bytes of the current request's head (with the empty lines before it)
and nothing else; ``over`` says it passed ``header_bytes``. The parser's callbacks
(``began``, ``headers_done``, ``completed``) move the phase; ``feed`` hands the parser
one slice at a time and accounts it once read. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

IDLE, HEAD, LENGTH, CHUNKED = "idle", "head", "length", "chunked"
END = b"\r\n\r\n"
BLANK = b"\r\n"


class Framing:
    """Head and body accounting of one HTTP/1.1 connection."""

    def __init__(self, header_bytes: int):
        self.header_bytes = header_bytes
        self.phase = IDLE
        self.head = 0  # bytes of the current head so far
        self.left = 0  # LENGTH: body bytes still to come
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
                self.phase, self._tail = CHUNKED, b""
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
        """Where the slice of ``data`` starting at ``at`` ends (exclusive)."""
        if self.phase == LENGTH:
            return min(len(data), at + self.left)
        if self.phase == IDLE:
            room = data[at:at + self.room()]
            blank = len(room) - len(room.lstrip(BLANK))
            return at + blank if blank else self._to_end(data, at, at + self.room())
        if self.phase == HEAD:
            return self._to_end(data, at, at + self.room())
        return self._to_end(data, at, len(data))

    def room(self) -> int:
        """Head bytes still allowed."""
        return max(0, self.header_bytes - self.head)

    def _to_end(self, data: bytes, at: int, stop: int) -> int:
        """Just past the first END in ``data[at:stop]`` (one that began in the previous
        slice included), else ``stop`` (at most the data's end)."""
        stop = min(stop, len(data))
        if self._tail:
            across = (self._tail + data[at:at + 3]).find(END)
            if across >= 0:
                return min(stop, at + across + len(END) - len(self._tail))
        found = data.find(END, at, stop)
        return found + len(END) if found >= 0 else stop

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
