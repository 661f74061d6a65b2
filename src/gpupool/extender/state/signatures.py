"""The extender's side of signed decisions: it signs what it binds, and counts a recorded
decision only when it can vouch for it.

A pod author can write any annotation and set ``spec.nodeName``, so a decision found on a
pod proves nothing by itself (``gpupool.security.signing``). Two pieces:

* ``DecisionKeys``: the extender's private keys (Secret ``gpupool-decision-signing``,
  through ``load``, which the composition root wires to ``gpupool.kube.keystore``). It
  signs a bind's ``Claims`` with the key active now and verifies with the public halves;
  a signature naming a key id it does not hold makes it read the keys again (at most
  every ``refresh_s``), and ``reload`` re-reads them on a timer, so a rotation made by
  another replica or by ``gpupool keys`` reaches it without a restart.
* ``DecisionCheck``: whether a pod's decision may be counted. It must belong to a pod that
  asks a gpupool GPU resource, and its signature must verify for that pod's uid,
  namespace, name, node, bind time, group and allocation string. Signatures are checked
  and remembered by ``gpupool.kube.verifier.DecisionVerifier`` over ``DecisionKeys.ring``
  (the one verifier node agents and the controller use too): remembered per exact signed
  bytes, signature and key ring, forgotten at once when the ring changes (a key rotated
  in, retired or revoked), at most ``MEMO_LIMIT`` outcomes.
  Each pod whose decision is refused is counted once in
  ``gpupool_extender_unverified_decisions_total{reason}`` and logged once, with the
  reason.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping

from prometheus_client import Counter

from gpupool.contract import names
from gpupool.kube.verifier import MEMO_LIMIT, DecisionVerifier
from gpupool.security.signing import Claims, KeyRing, SignatureError, SigningKeys, claims_of

log = logging.getLogger(__name__)

REPORTED_LIMIT = 100_000  # pods whose refusal was logged and counted

UNSIGNED = "unsigned"
UNKNOWN_KEY = "unknown-key"
INVALID = "invalid"
NOT_A_GPU_POD = "not-a-gpu-pod"

Verdict = tuple[str, str]  # (reason, why); VALID when the decision may be counted
VALID: Verdict = ("", "")


class DecisionKeys:
    """Signs decisions with the active private key; verifies with the public halves."""

    def __init__(self, load: Callable[[], SigningKeys], clock: Callable[[], float],
                 refresh_s: float = 10.0, keys: SigningKeys | None = None):
        self._load = load
        self._clock = clock
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        self._keys = keys if keys is not None else load()
        self._ring = self._keys.public()
        self._read_at = clock()

    def sign(self, claims: Claims) -> str:
        """The ``gpupool.io/signature`` value for ``claims``."""
        return self._keys.active(self._clock()).sign(claims)

    def ring(self, wanted: str | None = None) -> KeyRing:
        """The public keys; read again when ``wanted`` (a key id) is not among them and
        the last read is older than ``refresh_s``."""
        ring = self._ring
        if wanted is None or wanted in ring or self._clock() - self._read_at < self.refresh_s:
            return ring
        self.reload()
        return self._ring

    def reload(self) -> None:
        """Read the keys again (a failed read keeps the keys held and logs why)."""
        with self._lock:
            self._read_at = self._clock()
            try:
                keys = self._load()
            except Exception as exc:  # the API or the Secret: keep the keys held
                log.warning("reading the decision signing keys: %s", exc)
                return
            if keys.keys:
                self._keys, self._ring = keys, keys.public()


class DecisionCheck:
    """Which recorded decisions may be counted; thread-safe."""

    def __init__(self, keys: DecisionKeys | None, refused: Counter | None = None,
                 memo_limit: int = MEMO_LIMIT):
        self.keys = keys
        self.refused = refused
        self.verifier = DecisionVerifier(keys.ring, memo_limit) if keys is not None else None
        self._lock = threading.Lock()
        self._reported: OrderedDict[str, None] = OrderedDict()

    def counts(self, uid: str, namespace: str, name: str, notes: Mapping[str, str],
               asks_gpu: bool, vouched: bool = False) -> bool:
        """Whether the decision in ``notes`` may hold GPUs for this pod. ``vouched``: the
        decision equals the entry the extender wrote for this pod in its node's GPULedger
        (an object only the extender may write), which proves it as a signature does."""
        if not asks_gpu:
            self._report(uid, namespace, name, NOT_A_GPU_POD,
                         "it asks no gpupool GPU resource, so it can hold no GPU")
            return False
        if vouched:
            return True
        reason, why = self._verdict(claims_of(uid, namespace, name, notes),
                                    notes.get(names.ANNOTATION_SIGNATURE) or "")
        if reason:
            self._report(uid, namespace, name, reason, why)
            return False
        return True

    def _verdict(self, claims: Claims, signature: str) -> Verdict:
        """``VALID`` when ``signature`` vouches for ``claims``, else (reason, why)."""
        if not signature:
            return UNSIGNED, f"it carries no {names.ANNOTATION_SIGNATURE}"
        if self.verifier is None:
            return UNKNOWN_KEY, "this extender holds no decision keys"
        try:
            self.verifier.check(claims, signature)
        except SignatureError as exc:
            return (UNKNOWN_KEY if exc.code == SignatureError.UNKNOWN_KEY else INVALID), str(exc)
        return VALID

    def vouch(self, claims: Claims, signature: str) -> None:
        """Verify a signature this extender just made, so that its watch finds the outcome
        remembered (a signature that does not verify is logged: the watch refuses it)."""
        reason, why = self._verdict(claims, signature)
        if reason:
            log.error("the decision just signed for pod %s/%s does not verify (%s): %s",
                      claims.namespace, claims.name, reason, why)

    def _report(self, uid: str, namespace: str, name: str, reason: str, why: str) -> None:
        with self._lock:
            if uid in self._reported:
                return
            self._reported[uid] = None
            while len(self._reported) > REPORTED_LIMIT:
                self._reported.popitem(last=False)
        if self.refused is not None:
            self.refused.labels(reason).inc()
        log.warning("pod %s/%s (uid %s): its gpupool decision is not counted (%s): %s",
                    namespace, name, uid, reason, why)
