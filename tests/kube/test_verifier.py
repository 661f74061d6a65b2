"""The one decision verifier (extender, node agents, controller): what it answers, what it
remembers, and when it forgets — at once when the key ring changes."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpupool.contract import names
from gpupool.contract.annotations import encode
from gpupool.core.allocation import Allocation, Slice
from gpupool.kube.verifier import DecisionVerifier
from gpupool.security.signing import Claims, KeyRing, SignatureError, SigningKeys, claims_of

KEYS = SigningKeys().added(0.0)
OTHER = SigningKeys().added(0.0)  # a key nobody published (a tenant's own)
RING = KEYS.public()


def notes(uid: str = "uid-1", memory_mib: int = 1024, keys: SigningKeys | None = KEYS,
          name: str = "web") -> dict[str, str]:
    """A pod's decision annotations, signed for (``uid``, team-a, ``name``) with ``keys``."""
    alloc = Allocation(uid, "n1", 0, 0, (Slice("GPU-a", 0, memory_mib, 10, "main"),))
    out = encode(alloc, "2026-11-23T10:00:00.000000Z")
    if keys is not None:
        out[names.ANNOTATION_SIGNATURE] = keys.active(1.0).sign(
            claims_of(uid, "team-a", name, out))
    return out


def edited(ann: dict[str, str]) -> dict[str, str]:
    return {**ann, names.ANNOTATION_ALLOCATION: ann[names.ANNOTATION_ALLOCATION].replace(
        '"memoryMiB":1024', '"memoryMiB":16384')}


@dataclass
class Source:
    """A ring source whose ring the test swaps (rotation, retirement), counting asks."""

    ring: KeyRing
    asked: int = 0

    def __call__(self, wanted: str | None) -> KeyRing:
        self.asked += 1
        return self.ring


def check(v: DecisionVerifier, ann: dict[str, str], uid: str = "uid-1",
          name: str = "web") -> str:
    return v.verify(uid, "team-a", name, ann, ann.get(names.ANNOTATION_SIGNATURE))


# -- answers -----------------------------------------------------------------------------------

CASES: list[tuple[str, Any, str, str]] = [
    ("unsigned (a hand-written decision)", lambda: notes(keys=None), SignatureError.UNSIGNED,
     "carries no gpupool.io/signature"),
    ("signed with a key nobody published", lambda: notes(keys=OTHER),
     SignatureError.UNKNOWN_KEY, "not one of gpupool's published decision keys"),
    ("the allocation edited after signing", lambda: edited(notes()), SignatureError.MISMATCH,
     "does not match it (edited, or copied from another pod)"),
    ("the bind time edited", lambda: {**notes(), names.ANNOTATION_BIND_TIME: "2027"},
     SignatureError.MISMATCH, "does not match it"),
    ("a group added", lambda: {**notes(), names.ANNOTATION_RESOURCE_GROUP: "team-b"},
     SignatureError.MISMATCH, "does not match it"),
    ("a malformed signature", lambda: {**notes(), names.ANNOTATION_SIGNATURE: "v1.zz.x"},
     SignatureError.MALFORMED, "is not 'v1.<key id>.<signature>'"),
    ("a field with a NUL character", lambda: {**notes(), names.ANNOTATION_NODE: "n1\0"},
     SignatureError.MALFORMED, "holds a NUL character"),
    ("a field that is not valid text", lambda: {**notes(), names.ANNOTATION_NODE: "\ud800"},
     SignatureError.MALFORMED, "is not valid text"),
]


@pytest.mark.parametrize(("case", "make", "code", "words"), CASES, ids=[c[0] for c in CASES])
def test_a_decision_that_does_not_verify_is_refused_with_its_reason_every_time(
        case: str, make: Any, code: str, words: str) -> None:
    v = DecisionVerifier(Source(RING))
    ann = make()
    for _ in range(2):  # the second answer may come from the memo: the same refusal
        with pytest.raises(SignatureError) as err:
            check(v, ann)
        assert err.value.code == code and words in str(err.value)
        assert str(err.value).startswith("pod team-a/web")


def test_a_valid_decision_answers_its_key_id_and_is_checked_once() -> None:
    v = DecisionVerifier(Source(RING))
    ann = notes()
    assert [check(v, ann) for _ in range(3)] == [KEYS.keys[0].kid] * 3
    stats = v.stats()
    assert (stats.checked, stats.remembered, stats.size) == (1, 2, 1)


def test_a_decision_copied_onto_another_pod_is_refused_though_the_original_was_remembered(
        ) -> None:
    v = DecisionVerifier(Source(RING))
    ann = notes()
    assert check(v, ann)
    for uid, name in (("uid-2", "web"), ("uid-1", "thief")):
        with pytest.raises(SignatureError, match="copied from another pod"):
            check(v, ann, uid, name)
    assert v.stats().checked == 3


def test_the_memo_is_keyed_on_the_signed_bytes_not_on_the_signature_alone() -> None:
    v = DecisionVerifier(Source(RING))
    ann = notes()
    check(v, ann)
    with pytest.raises(SignatureError, match="does not match"):
        check(v, edited(ann))  # same signature string, other bytes
    unsigned_covered = {**ann, "gpupool.io/phase": "allocated", "other": "x"}
    assert check(v, unsigned_covered) == KEYS.keys[0].kid  # what the signature does not
    assert v.stats().checked == 2                          # cover changes nothing


# -- forgetting ---------------------------------------------------------------------------------


def test_a_retired_or_revoked_key_stops_verifying_at_once_though_remembered() -> None:
    source = Source(RING)
    v = DecisionVerifier(source)
    ann = notes()
    assert check(v, ann) and len(v) == 1
    source.ring = KeyRing({})  # the key retired (or revoked with --force)
    with pytest.raises(SignatureError) as err:
        check(v, ann)
    assert err.value.code == SignatureError.UNKNOWN_KEY
    assert v.stats().forgotten == 1


def test_a_key_rotated_in_makes_everything_checked_again() -> None:
    source = Source(RING)
    v = DecisionVerifier(source)
    ann = notes()
    check(v, ann)
    rotated = SigningKeys((*KEYS.keys, *OTHER.keys))
    source.ring = rotated.public()
    assert check(v, ann) == KEYS.keys[0].kid
    assert check(v, notes(keys=OTHER)) == OTHER.keys[0].kid
    assert v.stats().checked == 3


def test_the_same_ring_read_again_keeps_what_was_remembered() -> None:
    source = Source(RING)
    v = DecisionVerifier(source)
    ann = notes()
    check(v, ann)
    source.ring = KeyRing(dict(RING.keys))  # a fresh read of unchanged keys
    check(v, ann)
    assert (v.stats().checked, v.stats().forgotten) == (1, 0)


def test_a_refusal_for_an_unknown_key_is_forgotten_when_the_key_is_published() -> None:
    source = Source(RING)
    v = DecisionVerifier(source)
    ann = notes(keys=OTHER)
    with pytest.raises(SignatureError, match="not one of"):
        check(v, ann)
    source.ring = SigningKeys((*KEYS.keys, *OTHER.keys)).public()
    assert check(v, ann) == OTHER.keys[0].kid


def test_the_ring_is_asked_for_on_every_check_so_its_source_can_read_again() -> None:
    source = Source(RING)
    v = DecisionVerifier(source)
    for _ in range(3):
        check(v, notes())
    assert source.asked == 3


def test_the_memo_keeps_at_most_its_limit_forgetting_the_least_recently_used() -> None:
    v = DecisionVerifier(Source(RING), limit=2)
    a, b, c = notes("uid-a"), notes("uid-b"), notes("uid-c")
    check(v, a, "uid-a")
    check(v, b, "uid-b")
    check(v, a, "uid-a")  # used again: b is now the oldest
    check(v, c, "uid-c")
    assert len(v) == 2
    before = v.stats().checked
    check(v, a, "uid-a")
    assert v.stats().checked == before  # still remembered
    check(v, b, "uid-b")
    assert v.stats().checked == before + 1  # forgotten, checked again


def test_a_memo_of_no_outcomes_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        DecisionVerifier(Source(RING), limit=0)


# -- threads -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeldRing(KeyRing):
    """A ring whose checks wait until the test lets them go (a check still running)."""

    entered: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def verify(self, claims: Claims, signature: str | None) -> str:
        self.entered.set()
        assert self.release.wait(30)
        return KeyRing.verify(self, claims, signature)


def test_a_check_that_began_before_a_revocation_is_not_remembered_after_it() -> None:
    held = HeldRing(dict(RING.keys))
    source = Source(held)
    v = DecisionVerifier(source)
    ann = notes()
    answers: list[str] = []
    slow = threading.Thread(target=lambda: answers.append(check(v, ann)))
    slow.start()
    assert held.entered.wait(30)
    source.ring = KeyRing({})  # revoked while that check runs
    with pytest.raises(SignatureError, match="not one of"):
        check(v, ann)
    held.release.set()
    slow.join(30)
    assert answers == [KEYS.keys[0].kid]  # it answers for the ring it began with
    with pytest.raises(SignatureError, match="not one of"):
        check(v, ann)  # and nothing it found outlives the revocation


def test_concurrent_checks_agree_with_a_single_thread_and_stay_within_the_limit() -> None:
    v = DecisionVerifier(Source(RING), limit=16)
    good = [(f"uid-{i}", notes(f"uid-{i}")) for i in range(24)]
    bad = [(f"uid-x{i}", edited(notes(f"uid-x{i}"))) for i in range(24)]
    wrong: list[str] = []

    def work(seed: int) -> None:
        for k in range(120):
            uid, ann = (good if (k + seed) % 2 else bad)[(k * 7 + seed) % 24]
            try:
                check(v, ann, uid)
                ok = True
            except SignatureError:
                ok = False
            if ok == uid.startswith("uid-x"):  # only the edited ones are refused
                wrong.append(uid)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert wrong == [] and len(v) <= 16
    stats = v.stats()
    assert stats.checked + stats.remembered == 6 * 120
