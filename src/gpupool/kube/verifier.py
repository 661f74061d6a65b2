"""The one verifier of signed decisions: the extender, node agents and the controller all
check a pod's decision through ``DecisionVerifier``, and all remember the outcome the same way.

A pod author can write any annotation and set ``spec.nodeName``, so a decision proves
nothing until its signature verifies (``gpupool.security.signing``). Checking an Ed25519
signature costs ~0.1 ms, and every component checks the same decisions again and again
(the extender's watch and rebuild, each Allocate and audit on a node, each controller
round), so the outcome is remembered. What is remembered, and when it is forgotten:

* **The key** is the SHA-256 digest of the exact bytes the signature covers
  (``Claims.message``: pod uid, namespace, name, node, bind time, group, allocation)
  followed by the signature as written, under one version of the key ring. Nothing
  else: never a uid alone, never an annotation the signature does not cover. A decision
  edited or copied by anyone is other bytes, so it is checked afresh; 32 bytes per key,
  however long the allocation.
* **The outcome** is either the key id that signed it or the refusal (its ``code`` and
  sentence); both are a pure function of (ring, bytes, signature), so both may be
  remembered. A ring that cannot be read is never remembered (``KeyMaterialError`` is
  raised each time).
* **The ring's version** is its content: every key id with its public key. The ring is
  asked for on every check (``RingSource``: it re-reads the published keys when a
  decision names a key it does not hold, and on its own schedule), and as soon as it
  differs in any way — a key added, retired or revoked — everything remembered is
  forgotten at once, before the next answer. A result computed with the previous ring
  by a check still running is not stored.
* **Bounds**: at most ``limit`` outcomes, the least recently used forgotten first.

Thread-safe: one lock guards the memo; signatures are checked outside it.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization

from gpupool.security.signing import Claims, KeyRing, SignatureError, claims_of

log = logging.getLogger(__name__)

RingSource = Callable[[str | None], KeyRing]
"""``ring(wanted)``: the key ring to verify with now; ``wanted`` is the key id a decision
names (None when it names none), for a source that reads again on a key it lacks.
Raises ``KeyMaterialError`` while no ring can be had."""

MEMO_LIMIT = 200_000  # outcomes kept: about one per live GPU pod of a large cluster

Outcome = tuple[str, str]  # (key id, "") when valid; ("", refusal code) with the sentence
Version = frozenset[tuple[str, bytes]]


@dataclass(frozen=True, slots=True)
class MemoStats:
    """How the memo has served: checks answered from it, signatures checked, size now, and
    how often it was forgotten because the ring changed."""

    remembered: int
    checked: int
    size: int
    forgotten: int


class DecisionVerifier:
    """Verifies decisions with a ``RingSource`` and remembers the outcomes (module doc)."""

    def __init__(self, ring: RingSource, limit: int = MEMO_LIMIT):
        if limit < 1:
            raise ValueError(f"a decision memo holds at least one outcome, not {limit}")
        self._ring = ring
        self.limit = limit
        self._lock = threading.Lock()
        self._memo: OrderedDict[tuple[int, bytes], tuple[Outcome, str]] = OrderedDict()
        self._seen: KeyRing | None = None
        self._version: Version = frozenset()
        self._generation = 0
        self._remembered = self._checked = self._forgotten = 0

    def verify(self, uid: str, namespace: str, name: str, annotations: Mapping[str, str],
               signature: str | None) -> str:
        """The key id that signed the pod's decision (``annotations``); ``SignatureError``
        says why it must not be served or counted, ``KeyMaterialError`` that no key ring
        can be read now."""
        return self.check(claims_of(uid, namespace, name, annotations), signature)

    def check(self, claims: Claims, signature: str | None) -> str:
        """The key id that signed ``claims``; raises as ``verify`` does."""
        ring = self._ring(_kid_of(signature))
        digest = _digest(claims, signature or "")
        generation, known = self._lookup(ring, digest)
        if known is None:
            known = _outcome(ring, claims, signature)
            self._store(generation, digest, known)
        (kid, code), why = known
        if code:
            raise SignatureError(why, code)
        return kid

    def stats(self) -> MemoStats:
        with self._lock:
            return MemoStats(self._remembered, self._checked, len(self._memo), self._forgotten)

    def __len__(self) -> int:
        with self._lock:
            return len(self._memo)

    def _lookup(self, ring: KeyRing, digest: bytes) -> tuple[int, tuple[Outcome, str] | None]:
        with self._lock:
            if ring is not self._seen:
                self._follow(ring)
            known = self._memo.get((self._generation, digest))
            if known is None:
                self._checked += 1
            else:
                self._memo.move_to_end((self._generation, digest))
                self._remembered += 1
            return self._generation, known

    def _follow(self, ring: KeyRing) -> None:
        """Make ``ring`` the one remembered outcomes belong to (caller holds the lock)."""
        version = _version(ring)
        self._seen = ring
        if version == self._version:
            return
        if self._memo:
            log.info("decision keys are now %s: %d remembered verdicts forgotten",
                     ", ".join(sorted(ring.keys)) or "(none)", len(self._memo))
            self._forgotten += 1
        self._memo.clear()
        self._version = version
        self._generation += 1

    def _store(self, generation: int, digest: bytes, known: tuple[Outcome, str]) -> None:
        with self._lock:
            if generation != self._generation:
                return  # checked with a ring that has changed since: not remembered
            self._memo[(generation, digest)] = known
            while len(self._memo) > self.limit:
                self._memo.popitem(last=False)


def _outcome(ring: KeyRing, claims: Claims, signature: str | None) -> tuple[Outcome, str]:
    try:
        kid = ring.verify(claims, signature)
    except SignatureError as exc:
        return ("", exc.code), str(exc)
    return (_interned(ring, kid), ""), ""


def _interned(ring: KeyRing, kid: str) -> str:
    """The ring's own string for ``kid`` (one copy per key, however many are remembered)."""
    return next((k for k in ring.keys if k == kid), kid)


def _digest(claims: Claims, signature: str) -> bytes:
    """SHA-256 of the signed bytes, a NUL and the signature (``SignatureError`` when a
    field holds a NUL or is not valid text: no signature can cover it)."""
    return hashlib.sha256(b"%b\0%b" % (claims.message(),
                                        signature.encode("utf-8", "surrogatepass"))).digest()


def _version(ring: KeyRing) -> Version:
    return frozenset((kid, key.public_bytes(serialization.Encoding.Raw,
                                            serialization.PublicFormat.Raw))
                     for kid, key in ring.keys.items())


def _kid_of(signature: str | None) -> str | None:
    parts = (signature or "").split(".")
    return parts[1] if len(parts) == 3 else None
