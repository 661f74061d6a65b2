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
  of the layout's names, read as little-endian 8-byte words. The table is a
  two-choice (cuckoo) table: every name's row sits in one of two slots picked by its
  hash, so a lookup is one gather of slots for every name, a gather of those rows'
  lengths and words to check them, and the same again for the few (~8 %) not in
  their first slot: no probe rounds. The hash only narrows the search: a row is
  taken only when the length and every word of the name equal the row's. The slots
  hold 4-byte rows and the words are kept once per name, so the whole table is
  small enough to stay in the CPU's caches between two pods (the slots are at most
  a quarter full): 0.2 MB for 5,000 names of up to 8 bytes, 0.35 MB for 5,000 names
  of 40 bytes, 6.5 MB for 100,000 of those (slot records holding the words
  themselves took 29 MB there). In an alternating A/B over 5,000 shuffled names,
  with the caches warm or flushed, this layout took 0.87-0.97 of those records'
  time for 6-byte names and 0.96-1.00 for 40-byte names;
* anything else (whitespace between tokens, escapes, malformed lists), and lists of
  fewer than about 1,000 names (where numpy's fixed costs outweigh it: 500 names
  take ~0.07-0.1 ms this way, ~0.15 ms the other), is decoded by msgspec, checked and
  looked up in a dict (5,000 shuffled names: ~0.2 ms by numpy, ~0.45 ms by the dict).
* names that found no slot (names over 512 bytes; rows the cuckoo table could not
  place, which needs a freak run of hash collisions) are looked up by name among
  those the table did not find, so a lookup is exact whatever the hashes do.

Answers are rendered from per-layout entries gathered by row: a filter's passing
names (compact, so prioritize's copy of it is byte-identical) and a prioritize
``HostPriorityList`` (fixed-width entries, padded with spaces between tokens), whose
scores ``scaled`` maps onto kube-scheduler's 0..``MAX_SCORE``.
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
SHORT_LIST = 1000  # names: below, decoding and a dict cost less than numpy's fixed costs
QUOTE, COMMA, SPACE = ord('"'), ord(","), ord(" ")
NOT_A_LIST = "ExtenderArgs.NodeNames must be a list of node names"
NOT_A_NAME = "ExtenderArgs.NodeNames holds something that is not a node name"
_ANY_LIST = msgspec.json.Decoder(list[object])
_MULTIPLIERS = np.random.default_rng(0x6770_7570).integers(
    1, 2**63, 64, dtype=np.uint64) * np.uint64(2) + np.uint64(1)  # odd, fixed


def scaled(values: np.ndarray) -> np.ndarray:
    """Scores mapped linearly onto 0..10 (all equal: all 10)."""
    lo, hi = float(values.min()), float(values.max())
    if hi - lo <= 1e-12:
        return np.full(values.shape, MAX_SCORE, np.int64)
    return np.rint((values - lo) * MAX_SCORE / (hi - lo)).astype(np.int64)


def decisive(scores: np.ndarray, pick: int) -> None:
    """Make ``pick`` the one node with the top score: it gets ``MAX_SCORE``, every other
    node at most one less (in place). kube-scheduler adds ``score × weight × 10`` to its
    own plugins' scores and takes the highest total, a tie at random: without this, every
    node within a twentieth of the best value ties at 10, and the one bound need not be
    the one the policy chose (nor the one the extender assumed, ``state.assumptions``)."""
    np.minimum(scores, MAX_SCORE - 1, out=scores)
    scores[pick] = MAX_SCORE


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
    little-endian, zero past its end (one gather for all the words, one mask for the
    words that names end in)."""
    padded = data + bytes(8 * width)
    view = np.ndarray((len(padded) - 7,), "<u8", buffer=padded, strides=(1,))
    words = np.zeros((width, len(starts)), "<u8")
    if not len(starts):
        return words
    used = min(width, (int(lens.max()) + 7) // 8)  # the words past every name stay 0
    words[:used] = view[starts + np.arange(0, 8 * used, 8)[:, None]]
    full = int(lens.min()) // 8  # every name fills the words before this one
    if full < used:
        left = np.clip(lens - np.arange(8 * full, 8 * used, 8)[:, None], 0, 8)
        words[full:used] &= _MASKS.take(left)
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


def _slots(hashes: np.ndarray, bits: int) -> tuple[IntArray, IntArray]:
    """A name's two slots: the top and the bottom ``bits`` bits of its hash."""
    first = (hashes >> np.uint64(64 - bits)).astype(np.int64)
    second = (hashes & np.uint64((1 << bits) - 1)).astype(np.int64)
    return first, second


def _cuckoo(first: list[int], second: list[int], size: int, skip: list[bool]
            ) -> tuple[list[int], list[int]]:
    """(the row in each slot, -1 when empty; the rows in no slot). Each row goes to one
    of its two slots; a row finding both taken evicts the occupant of one, which moves
    to its own other slot, and so on (cuckoo hashing; a quarter full, the chains are
    short). A row still homeless after ``MAX_MOVES`` moves, and every row of ``skip``
    (names too long for the words kept), is left out: those are found by name."""
    occupant = [-1] * size
    homeless = [row for row, s in enumerate(skip) if s]
    for row in range(len(first)):
        if skip[row]:
            continue
        moving, slot = row, first[row]
        for _ in range(MAX_MOVES):
            if occupant[slot] < 0:
                occupant[slot] = moving
                break
            occupant[slot], moving = moving, occupant[slot]
            slot = second[moving] if slot == first[moving] else first[moving]
        else:
            homeless.append(moving)
    return occupant, homeless


_MASKS = np.array([(1 << (8 * b)) - 1 for b in range(9)], np.uint64)  # the low b bytes
MAX_WORDS = 64  # names of up to 512 bytes (DNS subdomains have 253 at most)
MAX_MOVES = 500  # cuckoo moves before a row is left to the lookup by name


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
        lens = np.array([len(b) for b in utf8], np.int64)
        words = _words(blob, np.cumsum(lens) - lens, lens, self.width)
        self.bits = max(4, (4 * len(names)).bit_length())  # a quarter full at most
        first, second = _slots(_hash(words), self.bits)
        occupant, self.overflow = _cuckoo(first.tolist(), second.tolist(), 1 << self.bits,
                                          (lens > 8 * self.width).tolist())
        self.slot_rows = np.array(occupant, np.int32)  # -1: an empty slot
        # row -1 (an empty slot) reads the extra last entry: length -1 matches no name
        self.lens = np.append(lens, -1).astype(np.int32)
        self.words = np.zeros((len(names) + 1, self.width), np.uint64)
        self.words[:-1] = words.T
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
            self._find(rows, fits, found.lens[fits],
                       _words(raw, found.starts[fits], found.lens[fits], self.width))
        unknown = np.flatnonzero(rows < 0)
        if not unknown.size:
            rows.flags.writeable = False
            return Matched(rows, SentNames(count, {}))
        pieces = [raw[s - 1:s + n + 1] for s, n in zip(found.starts[unknown].tolist(),
                                                          found.lens[unknown].tolist(),
                                                          strict=True)]
        names = decode_names(b"[" + b",".join(pieces) + b"]")  # checks them (UTF-8)
        missing: dict[int, str] = {}
        for k, name in zip(unknown.tolist(), names, strict=True):
            row = self.index.get(name, -1) if self.overflow else -1  # rows in no slot
            if row >= 0:
                rows[k] = row
            else:
                missing[k] = name
        rows.flags.writeable = False
        return Matched(rows, SentNames(count, missing))

    def _find(self, rows: IntArray, todo: IntArray, lens: IntArray, words: np.ndarray
              ) -> None:
        """Fill ``rows[todo]`` with the rows whose slot holds the sent name: its first
        slot for all of them, its second for those the first did not hold."""
        hashes = _hash(words)
        found, same = self._held(hashes >> np.uint64(64 - self.bits), lens, words)
        other = np.flatnonzero(~same)
        if other.size:
            second = hashes[other] & np.uint64((1 << self.bits) - 1)
            found[other] = self._held(second, lens[other], words[:, other])[0]
        rows[todo] = found

    def _held(self, slots: np.ndarray, lens: IntArray, words: np.ndarray
              ) -> tuple[IntArray, np.ndarray]:
        """(the row in each of ``slots`` if its name is the one of ``lens`` and ``words``,
        else -1; whether it is)."""
        held = self.slot_rows.take(slots.astype(np.intp))
        same = self.lens.take(held) == lens
        known = self.words.take(held, axis=0)
        for j in range(self.width):
            same &= known[:, j] == words[j]
        return np.where(same, held, -1).astype(np.int64), same

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
    padded = b"".join([entry.ljust(width, b" ") for entry in entries])
    return np.frombuffer(bytearray(padded), np.dtype((np.void, width)))  # writable


TAILS = _fixed([b"%2d}," % s for s in range(MAX_SCORE + 1)])  # " 0}," .. "10},"
