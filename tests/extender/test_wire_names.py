"""Node-name lists on the wire: rows of raw JSON arrays, and the answers rendered back."""

from __future__ import annotations

import json
import random

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.errors import InvalidInput
from gpupool.extender.wire import nodenames
from gpupool.extender.wire.nodenames import NameTable, _hash, _words, tokens

NAMES = [f"n{i}" for i in range(40)] + ["gpu-node-a.example.com", "x" * 8, "y" * 16,
                                        "ip-10-0-12-34.eu-west-1.compute.internal", "z" * 253]


def table(names: list[str] = NAMES, numpy_from: int = 0) -> NameTable:
    """A table whose lists of ``numpy_from`` bytes or more go the numpy way (all, unless
    told: the tests cover that path on small lists)."""
    t = NameTable(names, {n: i for i, n in enumerate(names)})
    t.short_list_bytes = numpy_from
    return t


def expected_rows(names: list[str], sent: list[str]) -> list[int]:
    index = {n: i for i, n in enumerate(names)}
    return [index.get(n, -1) for n in sent]


def test_a_shuffled_list_maps_every_name_to_its_row() -> None:
    sent = random.Random(3).sample(NAMES, len(NAMES))
    matched = table().match(msgspec.json.encode(sent))
    assert matched.rows.tolist() == expected_rows(NAMES, sent)
    assert matched.all_known


def test_a_byte_identical_list_reuses_its_rows() -> None:
    t = table()
    raw = msgspec.json.encode(NAMES[::-1])
    first = t.match(raw)
    assert t.match(bytes(bytearray(raw))) is first  # an equal copy, not the same object
    assert t.match(msgspec.json.encode(NAMES)) is not first


def test_a_filter_answer_remembered_is_matched_without_decoding() -> None:
    t = table()
    rows = np.array([3, 1, 2], np.int64)
    answer = t.names_json(rows)
    t.remember(answer, rows)
    assert t.match(answer).rows.tolist() == [3, 1, 2]
    assert t.match(answer).rows.flags.writeable is False


def test_unknown_names_mixed_in_get_no_row_and_keep_their_names() -> None:
    sent = ["n3", "cpu-only-7", "n1", "n10", "n", "n100", "x" * 7, "zz" * 300, "ünïcode"]
    matched = table().match(msgspec.json.encode(sent))
    assert matched.rows.tolist() == expected_rows(NAMES, sent)
    assert not matched.all_known
    assert {k: matched.names[k] for k in np.flatnonzero(matched.rows < 0).tolist()} == {
        1: "cpu-only-7", 4: "n", 5: "n100", 6: "x" * 7, 7: "zz" * 300, 8: "ünïcode"}
    with pytest.raises(IndexError):
        matched.names[0]  # a known position is read by row


@pytest.mark.parametrize("raw", [
    b'[ "n3", "n1" ]', b'["n3",\n"n1"]', b'["n\\u0033","n1"]', b'[  ]',
])
def test_lists_go_would_not_write_compactly_take_the_general_path(raw: bytes) -> None:
    assert tokens(raw) is None
    assert table().match(raw).rows.tolist() == expected_rows(NAMES, json.loads(raw))


@pytest.mark.parametrize("raw, message", [
    (b'["n1",""]', "not a node name"), (b'["n1",2]', "not a node name"),
    (b'["n1",null]', "not a node name"), (b'["n1" "n2"]', "must be a list"),
    (b'{"a":1}', "must be a list"), (b'["n1",]', "must be a list"),
    (b'["\xff"]', "not a node name"), (b'"n1"', "must be a list"),
])
def test_malformed_lists_are_refused_with_a_clear_error(raw: bytes, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        table().match(raw)


def test_the_empty_list_has_no_rows() -> None:
    assert tokens(b"[]") is not None
    assert table().match(b"[]").rows.tolist() == []
    assert table([]).match(b'["a"]').rows.tolist() == [-1]


def test_passing_names_render_compactly_in_row_order() -> None:
    rows = np.array([44, 0, 41, 7], np.int64)
    rendered = table().names_json(rows)
    assert rendered == msgspec.json.encode([NAMES[i] for i in rows.tolist()])
    assert table().names_json(np.array([], np.int64)) == b"[]"


def test_priorities_render_padded_json_that_decodes_to_the_hosts_and_scores() -> None:
    rows = np.array([44, 3, 41, 40], np.int64)
    scores = np.array([10, 0, 7, 12], np.int64)  # 12 is clipped to the maximum, 10
    rendered = table().priorities_json(rows, scores)
    want = [{"Host": NAMES[44], "Score": 10}, {"Host": "n3", "Score": 0},
            {"Host": NAMES[41], "Score": 7}, {"Host": NAMES[40], "Score": 10}]
    assert json.loads(rendered) == want
    assert msgspec.json.decode(rendered) == want
    assert b"   " in rendered  # fixed-width entries: spaces between tokens
    assert table().priorities_json(np.array([], np.int64), np.array([], np.int64)) == b"[]"


name_chars = st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789-.")
node_name = st.text(name_chars, min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(st.lists(node_name, min_size=0, max_size=60, unique=True),
       st.lists(node_name, max_size=20), st.randoms(use_true_random=False))
def test_rows_of_any_sent_list_equal_a_dict_lookup(layout: list[str], extra: list[str],
                                                   rng: random.Random) -> None:
    sent = layout + extra
    rng.shuffle(sent)
    t = table(layout)
    assert t.match(msgspec.json.encode(sent)).rows.tolist() == expected_rows(layout, sent)
    spaced = json.dumps(sent, separators=(", ", ": ")).encode()
    assert t.match(spaced).rows.tolist() == expected_rows(layout, sent)


def slots_of(t: NameTable, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The two slots of each of ``names`` in ``t``."""
    utf8 = [n.encode() for n in names]
    lens = np.array([len(n) for n in utf8])
    return nodenames._slots(_hash(_words(b"".join(utf8), np.cumsum(lens) - lens, lens,
                                          t.width)), t.bits)


def test_names_not_in_their_first_slot_are_found_in_their_second() -> None:
    names = [f"node-{i}" for i in range(5000)]
    t = table(names)
    first, second = slots_of(t, names)
    rows = np.arange(len(names))
    in_first = t.slot_rows[first] == rows
    assert (~in_first).any()  # some names were moved to their second slot
    assert (in_first | (t.slot_rows[second] == rows)).all() and not t.overflow
    sent = [*random.Random(5).sample(names, 5000), "node-5000", "node-"]
    assert t.match(msgspec.json.encode(sent)).rows.tolist() == expected_rows(names, sent)


def test_names_in_no_slot_are_found_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every name hashing alike (the same two slots for all) leaves all but two out of the
    table, and a name too long for the words kept has no slot: all are still found."""
    monkeypatch.setattr(nodenames, "_hash", lambda words: np.ones(words.shape[1], np.uint64))
    names = [f"node-{i}" for i in range(50)] + ["q" * 600]
    t = table(names)
    assert len(t.overflow) == len(names) - 2
    sent = [*random.Random(6).sample(names, len(names)), "node-50", "q" * 599]
    matched = t.match(msgspec.json.encode(sent))
    assert matched.rows.tolist() == expected_rows(names, sent)
    assert {matched.names[k] for k in np.flatnonzero(matched.rows < 0).tolist()} == {
        "node-50", "q" * 599}


def test_a_name_equal_but_for_trailing_zero_bytes_is_not_taken_for_the_name() -> None:
    with pytest.raises(InvalidInput, match="must be a list"):  # a raw NUL is not JSON
        table(["a", "b"]).match(b'["a' + bytes(1) + b'","b"]')


def test_passing_names_of_one_length_render_by_gather_in_row_order() -> None:
    names = [f"n{i:05d}" for i in range(300)]
    t = table(names)
    assert t.items is not None  # one length: fixed-width entries
    rows = np.array(random.Random(6).sample(range(300), 200), np.int64)
    assert t.names_json(rows) == msgspec.json.encode([names[i] for i in rows.tolist()])
    assert t.names_json(rows[:1]) == msgspec.json.encode([names[rows[0]]])


@pytest.mark.parametrize("pattern", ["n{:05d}", "node-{}", "ip-10-0-{}.ec2.internal", "gpu{}"])
@pytest.mark.parametrize("count", [100, 1000, 5000])
def test_names_a_digit_apart_mostly_sit_in_their_first_slot(pattern: str, count: int) -> None:
    """Numbered node names must spread over the table (each name not in its first slot
    costs a second gather), and every name must sit in one of its two slots."""
    names = [pattern.format(i) for i in range(count)]
    t = table(names)
    first, second = slots_of(t, names)
    rows = np.arange(count)
    in_first = t.slot_rows[first] == rows
    assert in_first.mean() >= 0.8
    assert (in_first | (t.slot_rows[second] == rows)).all() and not t.overflow


def test_short_lists_are_decoded_and_long_ones_tokenised(monkeypatch: pytest.MonkeyPatch) -> None:
    names = [f"node-{i}" for i in range(3000)]
    t = NameTable(names, {n: i for i, n in enumerate(names)})
    seen: list[int] = []

    def counted(raw: bytes) -> object:
        seen.append(len(raw))
        return tokens(raw)

    monkeypatch.setattr(nodenames, "tokens", counted)
    short = msgspec.json.encode(names[:500])
    assert t.match(short).rows.tolist() == list(range(500))
    assert seen == []
    whole = msgspec.json.encode(names[::-1])
    assert t.match(whole).rows.tolist() == list(range(2999, -1, -1))
    assert seen == [len(whole)]
