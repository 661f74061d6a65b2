"""Decision signatures: what verifies, and every forgery that must not."""

from __future__ import annotations

import dataclasses

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gpupool.contract import names
from gpupool.contract.annotations import encode
from gpupool.core.allocation import Allocation, Slice
from gpupool.security.signing import (
    Claims,
    KeyMaterialError,
    KeyRing,
    SignatureError,
    SigningKey,
    SigningKeys,
    claims_of,
)

NOW = 1_800_000_000.0


def _decision(uid: str = "uid-1", exclusive: bool = False) -> dict[str, str]:
    alloc = Allocation(uid, "node-1", 1000, 1024,
                       (Slice("GPU-aaaa", 0, 1024, 10, "main"),), exclusive)
    return encode(alloc, "2026-11-23T10:00:00.000001Z")


def _keys() -> SigningKeys:
    return SigningKeys().added(NOW - 60)


def _claims(notes: dict[str, str], uid: str = "uid-1", name: str = "web") -> Claims:
    return claims_of(uid, "team-a", name, notes)


def test_a_decision_signed_by_the_active_key_verifies_with_the_public_ring() -> None:
    keys = _keys()
    notes = _decision()
    signature = keys.active(NOW).sign(_claims(notes))
    assert keys.public().verify(_claims(notes), signature) == keys.active(NOW).kid


def test_a_decision_copied_to_another_pod_is_refused() -> None:
    keys = _keys()
    notes = _decision()
    signature = keys.active(NOW).sign(_claims(notes))
    with pytest.raises(SignatureError, match="copied from another pod"):
        keys.public().verify(_claims(notes, uid="uid-2", name="other"), signature)


@pytest.mark.parametrize("field", ["node", "bind_time", "group", "allocation", "namespace"])
def test_editing_any_signed_field_is_refused(field: str) -> None:
    keys = _keys()
    claims = _claims(_decision())
    signature = keys.active(NOW).sign(claims)
    edited = dataclasses.replace(claims, **{field: getattr(claims, field) + "x"})
    with pytest.raises(SignatureError, match="does not match"):
        keys.public().verify(edited, signature)


def test_widening_the_allocation_to_exclusive_is_refused() -> None:
    keys = _keys()
    signature = keys.active(NOW).sign(_claims(_decision()))
    with pytest.raises(SignatureError):
        keys.public().verify(_claims(_decision(exclusive=True)), signature)


def test_a_signature_by_an_unknown_key_is_refused_by_its_id() -> None:
    mine, theirs = _keys(), _keys()
    claims = _claims(_decision())
    signature = theirs.active(NOW).sign(claims)
    with pytest.raises(SignatureError, match="not one of gpupool's published"):
        mine.public().verify(claims, signature)


@pytest.mark.parametrize("signature", [
    None, "", "v2.0123456789abcdef.AAAA", "v1.xyz.AAAA", "v1.0123456789abcdef.!!!",
    "v1.0123456789abcdef.AAAA", "v1.0123456789abcdef." + "A" * 300, "garbage",
])
def test_malformed_signatures_are_refused_with_a_reason(signature: str | None) -> None:
    with pytest.raises(SignatureError, match="pod team-a/web"):
        _keys().public().verify(_claims(_decision()), signature)


_B64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def _other_spellings(signature: str) -> list[str]:
    """Spellings of the same 64 signature bytes that are not the canonical base64url one:
    the last character with other padding bits (86 characters carry 516 bits, the
    signature 512), "=" padding, the standard alphabet's "+" and "/", characters
    a lax decoder skips."""
    head, last = signature[:-1], _B64URL.index(signature[-1])
    kept = last & 0b110000  # the two bits that belong to the signature
    spellings = [head + _B64URL[kept | low] for low in range(16) if kept | low != last]
    spellings += [signature + "==", signature.replace("-", "+").replace("_", "/")]
    spellings += [signature[:-10] + stray * 4 + signature[-10:] for stray in "!\n"]
    return [s for s in spellings if s != signature]


def test_only_the_canonical_spelling_of_a_signature_verifies() -> None:
    key = SigningKey(Ed25519PrivateKey.from_private_bytes(bytes([1]) * 32), NOW)
    claims = _claims(_decision())
    signature = key.sign(claims)  # Ed25519 is deterministic: always this spelling
    assert "-" in signature or "_" in signature
    ring = SigningKeys((key,)).public()
    assert ring.verify(claims, signature) == key.kid
    others = _other_spellings(signature)
    assert len(others) == 19
    for other in others:
        with pytest.raises(SignatureError, match=r"is not (canonical )?base64url"):
            ring.verify(claims, other)


def test_a_nul_character_in_a_field_is_refused() -> None:
    keys = _keys()
    claims = dataclasses.replace(_claims(_decision()), name="we\0b")
    with pytest.raises(SignatureError, match="NUL"):
        keys.active(NOW).sign(claims)


def test_rotation_signs_with_the_newest_key_once_its_time_has_come() -> None:
    keys = _keys().added(NOW + 300)
    old, new = keys.keys
    assert keys.active(NOW).kid == old.kid
    assert keys.active(NOW + 301).kid == new.kid
    claims = _claims(_decision())
    ring = keys.public()
    assert ring.verify(claims, keys.active(NOW).sign(claims)) == old.kid
    assert ring.verify(claims, keys.active(NOW + 301).sign(claims)) == new.kid
    retired = keys.without([old.kid]).public()
    with pytest.raises(SignatureError, match="not one of"):
        retired.verify(claims, old.sign(claims))


def test_keys_round_trip_through_secret_and_configmap_data() -> None:
    keys = _keys().added(NOW + 10)
    again = SigningKeys.from_data(keys.to_data())
    assert [k.kid for k in again.keys] == [k.kid for k in keys.keys]
    assert [k.not_before for k in again.keys] == [k.not_before for k in keys.keys]
    ring = KeyRing.from_data(keys.public().to_data())
    claims = _claims(_decision())
    assert ring.verify(claims, again.active(NOW).sign(claims))


def test_an_empty_key_set_cannot_sign() -> None:
    with pytest.raises(KeyMaterialError, match="no decision signing key"):
        SigningKeys().active(NOW)


@pytest.mark.parametrize(("entry", "value", "expected"), [
    ("0123456789abcdef.pem", "not a key", "not a PEM public key"),
    ("0123456789abcdef.pem", None, "not a PEM public key"),
])
def test_a_broken_public_key_entry_is_named(entry: str, value: str, expected: str) -> None:
    with pytest.raises(KeyMaterialError, match=entry.replace(".", r"\.") + ".*" + expected):
        KeyRing.from_data({entry: value})  # type: ignore[dict-item]


def test_a_public_key_filed_under_another_id_is_refused() -> None:
    data = _keys().public().to_data()
    (_entry, pem), = data.items()
    with pytest.raises(KeyMaterialError, match="not the one named"):
        KeyRing.from_data({"0000000000000000.pem": pem})


@pytest.mark.parametrize("raw", ["{", "{}", '{"notBefore": "x", "privateKey": "y"}'])
def test_a_broken_private_key_entry_is_named(raw: str) -> None:
    with pytest.raises(KeyMaterialError, match=r"Secret entry k\.json"):
        SigningKeys.from_data({"k.json": raw})


def test_the_signature_annotation_key_is_gpupools() -> None:
    assert names.ANNOTATION_SIGNATURE == "gpupool.io/signature"


def test_each_refusal_says_which_case_it_is() -> None:
    keys = _keys()
    claims = _claims(_decision())
    ring = keys.public()
    cases = [
        (None, SignatureError.UNSIGNED),
        ("garbage", SignatureError.MALFORMED),
        (_keys().active(NOW).sign(claims), SignatureError.UNKNOWN_KEY),
        (keys.active(NOW).sign(_claims(_decision(exclusive=True))), SignatureError.MISMATCH),
    ]
    for signature, code in cases:
        with pytest.raises(SignatureError) as caught:
            ring.verify(claims, signature)
        assert caught.value.code == code, signature
