"""Decision signatures: only decisions the extender made for a pod are served or counted.

A pod author can write any annotation and set ``spec.nodeName``, so a decision in a
pod's annotations proves nothing by itself. The extender therefore signs each
decision with an Ed25519 key (``SigningKeys``, kept in a Secret only the extender
reads) and writes the signature in the same Binding as the decision; node agents, the
extender's rebuild and the controller check it with the public keys (``KeyRing``,
published in a ConfigMap) before serving or counting the decision.

The signed message binds the decision to one pod, node and bind::

    gpupool.io/decision/v1 NUL <pod uid> NUL <namespace> NUL <name> NUL <node> NUL
    <bind time> NUL <resource group or ""> NUL <the gpupool.io/allocation value, as written>

(fields joined by a NUL byte, which none of them may contain). The annotation
``gpupool.io/signature`` holds ``v1.<key id>.<signature, base64url without padding>``.
The key id is the first 16 hex digits of the SHA-256 of the raw public key, so every
holder of a public key derives the same id.

Copying a decision onto another pod changes the uid; editing any field changes the
message; a key the ring does not hold is refused by id. The phase
(``allocating``/``allocated``/``failed``) is not signed: the node agent advances it,
and no phase value can widen what a decision grants.

Rotation without downtime: a new key is added with a ``not_before`` time in the
future and its public half published at once; the extender signs with the newest key
whose ``not_before`` has passed (``SigningKeys.active``), so by the time the new key
signs, every node has had the time to read it. Old public keys stay published until
no live decision uses them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from gpupool.contract import names
from gpupool.core.errors import InvalidInput

DOMAIN = "gpupool.io/decision/v1"
PREFIX = "v1"
MAX_SIGNATURE_CHARS = 256  # "v1." + 16 hex + "." + 86 base64 characters is 106


class SignatureError(InvalidInput):
    """A decision that must not be served or counted; the message says why, ``code`` says
    which case it is (for metrics and for telling a key not read yet from a forgery)."""

    UNSIGNED = "unsigned"
    MALFORMED = "malformed"
    UNKNOWN_KEY = "unknown-key"
    MISMATCH = "mismatch"

    def __init__(self, message: str, code: str = MALFORMED):
        super().__init__(message)
        self.code = code


class KeyMaterialError(InvalidInput):
    """Key material that cannot be read; the message names the entry and what is wrong."""


@dataclass(frozen=True, slots=True)
class Claims:
    """What a signature vouches for: this allocation, for this pod, on this node."""

    uid: str
    namespace: str
    name: str
    node: str
    bind_time: str
    group: str
    allocation: str  # the gpupool.io/allocation annotation, byte for byte

    def message(self) -> bytes:
        fields = (DOMAIN, self.uid, self.namespace, self.name, self.node, self.bind_time,
                  self.group, self.allocation)
        joined = "\0".join(fields)
        if joined.count("\0") != len(fields) - 1:  # a field holds one itself
            raise SignatureError(f"pod {self.namespace}/{self.name}: a decision field holds a "
                                 "NUL character")
        try:
            return joined.encode()
        except UnicodeEncodeError:  # a lone surrogate, from a JSON "\ud800" escape
            raise SignatureError(f"pod {self.namespace}/{self.name}: a decision field is not "
                                 "valid text") from None


def claims_of(uid: str, namespace: str, name: str, annotations: Mapping[str, str]) -> Claims:
    """The claims a pod's decision annotations make (missing ones read as empty)."""
    return Claims(uid, namespace, name, annotations.get(names.ANNOTATION_NODE, ""),
                  annotations.get(names.ANNOTATION_BIND_TIME, ""),
                  annotations.get(names.ANNOTATION_RESOURCE_GROUP, ""),
                  annotations.get(names.ANNOTATION_ALLOCATION, ""))


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


# -- the public side --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeyRing:
    """Public keys by key id: what node agents, the rebuild and the controller verify with."""

    keys: Mapping[str, Ed25519PublicKey] = field(default_factory=dict)

    def verify(self, claims: Claims, signature: str | None) -> str:
        """The key id that signed ``claims``; ``SignatureError`` says why not."""
        who = f"pod {claims.namespace}/{claims.name}"
        if not signature:
            raise SignatureError(f"{who}: the decision carries no {names.ANNOTATION_SIGNATURE} "
                                 "(not made by gpupool's scheduler)", SignatureError.UNSIGNED)
        kid, raw = _parse(who, signature)
        public = self.keys.get(kid)
        if public is None:
            raise SignatureError(f"{who}: the decision is signed with key {kid}, which is not "
                                 "one of gpupool's published decision keys",
                                 SignatureError.UNKNOWN_KEY)
        try:
            public.verify(raw, claims.message())
        except InvalidSignature:
            raise SignatureError(f"{who}: the decision's signature does not match it (edited, "
                                 "or copied from another pod)", SignatureError.MISMATCH) from None
        return kid

    def __contains__(self, kid: object) -> bool:
        return kid in self.keys

    def to_data(self) -> dict[str, str]:
        """ConfigMap ``data``: ``<key id>.pem`` -> the public key (SubjectPublicKeyInfo PEM)."""
        return {f"{kid}.pem": k.public_bytes(serialization.Encoding.PEM,
                                             serialization.PublicFormat.SubjectPublicKeyInfo
                                             ).decode()
                for kid, k in sorted(self.keys.items())}

    @classmethod
    def from_data(cls, data: Mapping[str, str] | None, where: str = "ConfigMap") -> KeyRing:
        """Read ``to_data``'s form; an entry that is not a valid Ed25519 public key under
        its own id raises ``KeyMaterialError`` naming it (a ring is all or nothing)."""
        keys: dict[str, Ed25519PublicKey] = {}
        for entry, pem in sorted((data or {}).items()):
            if not entry.endswith(".pem"):
                continue
            try:
                public = serialization.load_pem_public_key(str(pem).encode())
            except (ValueError, TypeError) as exc:
                raise KeyMaterialError(
                    f"{where} entry {entry}: not a PEM public key ({exc})") from None
            if not isinstance(public, Ed25519PublicKey):
                raise KeyMaterialError(f"{where} entry {entry}: not an Ed25519 key")
            kid = key_id(public)
            if entry != f"{kid}.pem":
                raise KeyMaterialError(f"{where} entry {entry}: holds key {kid}, not the one named")
            keys[kid] = public
        return cls(keys)


def _parse(who: str, signature: str) -> tuple[str, bytes]:
    if len(signature) > MAX_SIGNATURE_CHARS:
        raise SignatureError(f"{who}: {names.ANNOTATION_SIGNATURE} is too long")
    parts = signature.split(".")
    if len(parts) != 3 or parts[0] != PREFIX or len(parts[1]) != 16 or \
            any(ch not in "0123456789abcdef" for ch in parts[1]):
        raise SignatureError(f"{who}: {names.ANNOTATION_SIGNATURE} is not "
                             f"'{PREFIX}.<key id>.<signature>'")
    try:
        raw = base64.urlsafe_b64decode(parts[2] + "=" * (-len(parts[2]) % 4))
    except (binascii.Error, ValueError):
        raise SignatureError(f"{who}: {names.ANNOTATION_SIGNATURE} is not base64url") from None
    if len(raw) != 64:
        raise SignatureError(f"{who}: {names.ANNOTATION_SIGNATURE} is not an Ed25519 signature")
    if _spelled(raw) != parts[2]:  # one spelling per signature: no other padding bits,
        # '=', '+', '/' or characters a lax decoder skips
        raise SignatureError(f"{who}: {names.ANNOTATION_SIGNATURE} is not canonical base64url "
                             "(unpadded, as gpupool writes it)")
    return parts[1], raw


def _spelled(raw: bytes) -> str:
    """``raw`` as a signature spells it: base64url without padding."""
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


# -- the private side ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SigningKey:
    """One private key and the time from which it may sign (seconds since the epoch)."""

    key: Ed25519PrivateKey
    not_before: float

    @property
    def kid(self) -> str:
        return key_id(self.key.public_key())

    def sign(self, claims: Claims) -> str:
        """The ``gpupool.io/signature`` value for ``claims``."""
        raw = self.key.sign(claims.message())
        return f"{PREFIX}.{self.kid}.{_spelled(raw)}"


@dataclass(frozen=True, slots=True)
class SigningKeys:
    """The extender's private keys (from its Secret), oldest first."""

    keys: tuple[SigningKey, ...] = ()

    def active(self, now: float) -> SigningKey:
        """The newest key already allowed to sign (the oldest one if none is yet)."""
        if not self.keys:
            raise KeyMaterialError("there is no decision signing key")
        ready = [k for k in self.keys if k.not_before <= now]  # oldest first: on a tie of
        return ready[-1] if ready else self.keys[0]             # times, the later in order

    def public(self) -> KeyRing:
        return KeyRing({k.kid: k.key.public_key() for k in self.keys})

    def added(self, not_before: float) -> SigningKeys:
        """These keys and a fresh one that signs from ``not_before``."""
        fresh = SigningKey(Ed25519PrivateKey.generate(), not_before)
        return SigningKeys(tuple(sorted((*self.keys, fresh), key=lambda k: k.not_before)))

    def without(self, kids: Iterable[str]) -> SigningKeys:
        drop = set(kids)
        return SigningKeys(tuple(k for k in self.keys if k.kid not in drop))

    def to_data(self) -> dict[str, str]:
        """Secret ``data`` (before base64): ``<key id>.json`` -> ``{"notBefore": RFC 3339,
        "privateKey": PKCS#8 PEM}``."""
        out = {}
        for k in self.keys:
            pem = k.key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()).decode()
            stamp = datetime.fromtimestamp(k.not_before, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            out[f"{k.kid}.json"] = json.dumps({"notBefore": stamp, "privateKey": pem},
                                              sort_keys=True)
        return out

    @classmethod
    def from_data(cls, data: Mapping[str, str] | None, where: str = "Secret") -> SigningKeys:
        """Read ``to_data``'s form; a broken entry raises ``KeyMaterialError`` naming it."""
        keys = [_signing_key(entry, raw, where) for entry, raw in sorted((data or {}).items())
                if entry.endswith(".json")]
        return cls(tuple(sorted(keys, key=lambda k: (k.not_before, k.kid))))


def _signing_key(entry: str, raw: str, where: str) -> SigningKey:
    try:
        body = json.loads(raw)
        key = serialization.load_pem_private_key(str(body["privateKey"]).encode(), None)
        not_before = datetime.strptime(str(body["notBefore"]), "%Y-%m-%dT%H:%M:%SZ"
                                       ).replace(tzinfo=UTC).timestamp()
    except (ValueError, TypeError, KeyError) as exc:
        raise KeyMaterialError(f"{where} entry {entry}: not a decision signing key "
                        f"({type(exc).__name__}: {exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyMaterialError(f"{where} entry {entry}: not an Ed25519 key")
    signing = SigningKey(key, not_before)
    if entry != f"{signing.kid}.json":
        raise KeyMaterialError(f"{where} entry {entry}: holds key {signing.kid}, not the one named")
    return signing
