"""Node-name lists on the wire: matched to state rows and rendered back, in C loops.

kube-scheduler (``nodeCacheCapable: true``) sends filter the nodes that passed its
own plugins, in an order that changes from pod to pod, and prioritize the nodes
filter passed, in the order filter answered. At 5,000 nodes a list is 50-200 KB of
JSON, and turning it into 5,000 Python strings and hashing them costs about as much
as the decision itself. So a list stays the JSON array it came in as, and a
``NameTable`` (one per state layout) finds its rows:

* a list byte-identical to one matched recently (the same list again) reuses its
  rows after one ``memcmp``;
* a list in the form Go's encoder writes (``["a","b"]``: compact, no escapes) is
  tokenised with numpy (the positions of its quotes) and looked up in a hash table
  of the layout's names, read as little-endian 8-byte words. The hash only narrows
  the search: a row is taken only when every word of the name equals the row's;
* anything else (whitespace between tokens, escapes, malformed lists), and lists of
  fewer than about 2,000 names (where numpy's fixed costs outweigh it: 1,000 names
  take ~0.09 ms this way, ~0.15 ms the other), is decoded by msgspec, checked and
  looked up in a dict (5,000 shuffled names: ~0.3 ms by numpy, ~0.5 ms by the dict).

Answers are rendered from per-layout entries gathered by row: a filter's passing
names (compact, so prioritize's copy of it is byte-identical) and a prioritize
``HostPriorityList`` (fixed-width entries, padded with spaces between tokens).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import overload

import msgspec
import numpy as np

from gpupool.core.errors import InvalidInput
from gpupool.core.state import IntArray

MAX_NODES = 100_000
MAX_SCORE = 10  # MaxExtenderPriority
RECENT_LISTS = 8
SHORT_LIST = 2000  # names: below, decoding and a dict cost less than numpy's fixed costs
QUOTE, COMMA, SPACE = ord('"'), ord(","), ord(" ")
NOT_A_LIST = "ExtenderArgs.NodeNames must be a list of node names"
NOT_A_NAME = "ExtenderArgs.NodeNames holds something that is not a node name"
_ANY_LIST = msgspec.json.Decoder(list[object])
_MULTIPLIERS = np.random.default_rng(0x6770_7570).integers(
    1, 2**63, 64, dtype=np.uint64) * np.uint64(2) + np.uint64(1)  # odd, fixed


class SentNames(Sequence[str]):
    """The names of the sent nodes that have no row (``-1``), by position; the other
    positions are known by row and are not turned into strings."""

    def __init__(self, count: int, unknown: Mapping[int, str]):
        self.size = count
        self.unknown = dict(unknown)

    def __len__(self) -> int:
        return self.size

    @overload
    def __getitem__(self, k: int) -> str: ...
    @overload
    def __getitem__(self, k: slice) -> Sequence[str]: ...

    def __getitem__(self, k: int | slice) -> str | Sequence[str]:
        if isinstance(k, slice):
            raise TypeError("SentNames cannot be sliced")
        try:
            return self.unknown[k]
        except KeyError:
            raise IndexError(f"position {k} has a row: read its name by row") from None

    def __iter__(self) -> Iterator[str]:
        raise TypeError("SentNames holds only the names without a row")


@dataclass(frozen=True, slots=True)
class Matched:
    """The state rows of a sent list (``-1``: a name without GPU inventory here)."""

    rows: IntArray
    names: SentNames

    @property
    def all_known(self) -> bool:
        return not self.names.unknown


@dataclass(frozen=True, slots=True)
class _Tokens:
    """Where the names of a compact list lie in it: ``starts`` and ``lens`` in bytes."""

    starts: IntArray
    lens: IntArray


def tokens(raw: bytes) -> _Tokens | None:
    """Name positions of ``raw`` when it is exactly ``["a","b",...]`` (no whitespace, no
    escapes, no empty name), else None (the general path decides)."""
    if raw == b"[]":
        return _Tokens(np.empty(0, np.int64), np.empty(0, np.int64))
    if len(raw) < 4 or raw[:2] != b'["' or raw[-2:] != b'"]' or b"\\" in raw:
        return None
    buf = np.frombuffer(raw, np.uint8)
    quotes = np.flatnonzero(buf == QUOTE)
    if quotes.size % 2:
        return None
    opens, closes = quotes[0::2], quotes[1::2]
    if not ((opens[1:] == closes[:-1] + 2).all() and (buf[closes[:-1] + 1] == COMMA).all()):
        return None
    lens = closes - opens - 1
    if quotes[-1] != len(raw) - 2 or not lens.all():
        return None
    return _Tokens(opens + 1, lens)


def decode_names(raw: bytes) -> list[str]:
    """The names of a JSON array, checked: a list of non-empty strings, or ``InvalidInput``."""
    try:
        names = _ANY_LIST.decode(raw)
    except msgspec.DecodeError:
        raise InvalidInput(NOT_A_LIST) from None
    except UnicodeDecodeError:
        raise InvalidInput(NOT_A_NAME) from None
    return checked_names(names)


def checked_names(names: object) -> list[str]:
    if not isinstance(names, list) or len(names) > MAX_NODES:
        raise InvalidInput(NOT_A_LIST)
    try:  # C-speed checks of thousands of names: join refuses non-strings, all() ""
        "".join(names)
    except TypeError:
        raise InvalidInput(NOT_A_NAME) from None
    if not all(names):
        raise InvalidInput(NOT_A_NAME)
    return names


def _words(data: bytes, starts: IntArray, lens: IntArray, width: int) -> np.ndarray:
    """``(width, names)`` uint64: word ``j`` of a name holds its bytes ``8j..8j+7``,
    little-endian, zero past its end."""
    padded = data + bytes(8 * width)
    view = np.ndarray((len(padded) - 7,), "<u8", buffer=padded, strides=(1,))
    words = np.zeros((width, len(starts)), "<u8")
    shortest, longest = (int(lens.min()), int(lens.max())) if len(lens) else (0, 0)
    for j in range(min(width, (longest + 7) // 8)):  # the words past every name stay 0
        if 8 * (j + 1) <= shortest:  # every name fills this word
            words[j] = view[starts + 8 * j]
        else:
            np.bitwise_and(view[starts + 8 * j], _MASKS.take(np.clip(lens - 8 * j, 0, 8)),
                           out=words[j])
    return words


def _hash(words: np.ndarray) -> np.ndarray:
    h = words[0] * _MULTIPLIERS[0]
    for j in range(1, len(words)):
        h += words[j] * _MULTIPLIERS[j]
    return _fmix64(h)


def _fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's finaliser: every output bit depends on every input bit, so names
    that differ in a digit or two (``n00041``, ``n00042``) land far apart in the table
    rather than in one long run of neighbouring slots."""
    h = h ^ (h >> np.uint64(33))
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xC4CEB9FE1A85EC53)
    mixed: np.ndarray = h ^ (h >> np.uint64(33))
    return mixed


_MASKS = np.array([(1 << (8 * b)) - 1 for b in range(9)], np.uint64)  # the low b bytes
MAX_WORDS = 64  # names of up to 512 bytes (DNS subdomains have 253 at most)


class NameTable:
    """The names of one state layout: their rows, and their rendered answer entries."""

    def __init__(self, names: Sequence[str], index: Mapping[str, int]):
        self.names = np.array(names, dtype=object)
        self.index = index
        utf8 = [n.encode() for n in names]
        self.quoted = np.array([msgspec.json.encode(n) for n in names], dtype=object)
        self.recent: list[tuple[bytes, Matched]] = []
        mean_quoted = sum(map(len, self.quoted.tolist())) / max(1, len(names))
        self.short_list_bytes = int(SHORT_LIST * (mean_quoted + 1))  # about SHORT_LIST names
        self.width = min(MAX_WORDS, max(1, (max(map(len, utf8), default=0) + 7) // 8))
        blob = b"".join(utf8)
        self.lens = np.array([len(b) for b in utf8], np.int64)
        starts = np.cumsum(self.lens) - self.lens
        self.words = _words(blob, starts, self.lens, self.width)
        hashes = _hash(self.words)
        self.bits = max(4, (4 * len(names)).bit_length())
        self.slots = np.full(1 << self.bits, -1, np.int32)  # row per slot, -1: none
        mask = (1 << self.bits) - 1
        for row, slot in enumerate((hashes >> np.uint64(64 - self.bits)).tolist()):
            if self.lens[row] > 8 * self.width:
                continue
            while self.slots[slot] >= 0:  # linear probing (once per layout)
                slot = (slot + 1) & mask
            self.slots[slot] = row
        quoted = self.quoted.tolist()
        self.items = _fixed([q + b"," for q in quoted]) \
            if len(set(map(len, quoted))) == 1 else None  # names of one length: a gather
        self.heads = _fixed([b'{"Host":' + q + b',"Score":' for q in quoted])
        self.entry = np.dtype([("head", self.heads.dtype), ("tail", TAILS.dtype)])

    # -- sent names -> rows ---------------------------------------------------------------
    def match(self, raw: bytes) -> Matched:
        """Rows of the JSON array ``raw`` (``InvalidInput`` when it is not a list of names)."""
        for seen, matched in self.recent:
            if seen == raw:  # length first, then memcmp
                return matched
        found = tokens(raw) if len(raw) >= self.short_list_bytes else None
        matched = self._lookup(raw, found) if found is not None else self.match_names(
            decode_names(raw))
        self._keep(raw, matched)
        return matched

    def remember(self, raw: bytes, rows: IntArray) -> None:
        """``raw`` lists the nodes at ``rows`` (a filter answer: prioritize sends it back)."""
        rows.flags.writeable = False
        self._keep(raw, Matched(rows, SentNames(len(rows), {})))

    def _keep(self, raw: bytes, matched: Matched) -> None:
        self.recent.insert(0, (raw, matched))
        del self.recent[RECENT_LISTS:]

    def match_names(self, names: Sequence[str]) -> Matched:
        """Rows of names already decoded (a NodeList's, or the general path's)."""
        rows = np.fromiter(map(self.index.get, names, repeat(-1, len(names))), np.int64,
                           len(names))
        rows.flags.writeable = False
        unknown = np.flatnonzero(rows < 0).tolist()
        return Matched(rows, SentNames(len(names), {k: names[k] for k in unknown}))

    def _lookup(self, raw: bytes, found: _Tokens) -> Matched:
        count = len(found.starts)
        if count > MAX_NODES:
            raise InvalidInput(NOT_A_LIST)
        rows = np.full(count, -1, np.int64)
        if count and len(self.names):
            fits = np.flatnonzero(found.lens <= 8 * self.width)
            self._probe(rows, fits, found.lens[fits],
                        _words(raw, found.starts[fits], found.lens[fits], self.width))
        rows.flags.writeable = False
        unknown = np.flatnonzero(rows < 0)
        if not unknown.size:
            return Matched(rows, SentNames(count, {}))
        pieces = [raw[s - 1:s + n + 1] for s, n in zip(found.starts[unknown].tolist(),
                                                          found.lens[unknown].tolist(),
                                                          strict=True)]
        names = decode_names(b"[" + b",".join(pieces) + b"]")  # checks them (UTF-8)
        return Matched(rows, SentNames(count, dict(zip(unknown.tolist(), names, strict=True))))

    def _probe(self, rows: IntArray, todo: IntArray, lens: IntArray, words: np.ndarray
               ) -> None:
        """Fill ``rows[todo]`` with the rows whose length and words equal the sent
        names' (vectorised linear probing: each round tries the next slot of the
        names not settled yet, until an empty slot says a name is unknown)."""
        slot = (_hash(words) >> np.uint64(64 - self.bits)).astype(np.int64)
        mask = (1 << self.bits) - 1
        while todo.size:
            cand = self.slots.take(slot)
            same = self.lens.take(cand) == lens
            for j in range(self.width):
                same &= self.words[j].take(cand) == words[j]
            occupied = cand >= 0
            same &= occupied
            rows[todo[same]] = cand[same]
            more = occupied & ~same
            if not more.any():
                return
            todo, slot = todo[more], (slot[more] + 1) & mask
            lens, words = lens[more], words[:, more]

    # -- rows -> answers ---------------------------------------------------------------------
    def names_json(self, rows: IntArray) -> bytes:
        """``["a","b"]`` of the nodes at ``rows``, compact as Go writes it (so that
        prioritize's copy of a filter answer is byte-identical to it)."""
        if self.items is None or len(rows) == 0:  # names of several lengths: a join
            return b"[" + b",".join(self.quoted[rows].tolist()) + b"]"
        out = np.empty(1 + len(rows) * self.items.itemsize, np.uint8)
        out[1:].view(self.items.dtype)[:] = self.items.take(rows)
        out[0], out[-1] = ord("["), ord("]")
        return out.tobytes()

    def priorities_json(self, rows: IntArray, scores: IntArray) -> bytes:
        """The ``HostPriorityList`` of ``rows`` with ``scores`` (0..10), gathered from
        fixed-width entries: ``{"Host":"a","Score":   7},``."""
        if len(rows) == 0:
            return b"[]"
        out = np.empty(1 + len(rows) * self.entry.itemsize, np.uint8)
        entries = out[1:].view(self.entry)
        entries["head"] = self.heads.take(rows)
        entries["tail"] = TAILS.take(np.clip(scores, 0, MAX_SCORE))
        out[0], out[-1] = ord("["), ord("]")  # the last entry's comma becomes the "]"
        return out.tobytes()


def _fixed(entries: Sequence[bytes]) -> np.ndarray:
    """``entries`` padded with spaces to one width, as a 1-d array of that many bytes each
    (``take`` gathers such rows several times faster than a 2-d uint8 array's)."""
    width = max(map(len, entries), default=1)
    table = np.full((len(entries), width), SPACE, np.uint8)
    for i, entry in enumerate(entries):
        table[i, :len(entry)] = np.frombuffer(entry, np.uint8)
    return table.view(np.dtype((np.void, width))).reshape(len(entries))


TAILS = _fixed([b"%2d}," % s for s in range(MAX_SCORE + 1)])  # " 0}," .. "10},"
