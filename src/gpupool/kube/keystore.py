"""Where gpupool keeps its decision-signing keys in the cluster, and how they rotate.

* Secret ``gpupool-decision-signing`` in gpupool's namespace: the extender's private
  keys (``SigningKeys.to_data``). Only the extender may read it (RBAC names it).
* ConfigMap ``gpupool-decision-keys`` beside it: the public keys
  (``KeyRing.to_data``), read by node agents, the controller and the extender. It
  mirrors the Secret: a key retired from one is retired from the other.

``ensure_signing_keys`` is what an extender calls at start: it creates the first key
when there is none (two replicas starting at once: the loser of the create reads the
winner's key) and publishes the public keys. ``rotate`` adds a key that signs only
after ``delay_s`` (so that every reader has it first); ``retire`` removes one.
``KeyRingSource`` is the readers' side: the published ring, read again when a
decision names a key it does not hold (at most every ``refresh_s``), so a rotation
reaches every node without a restart, and when it is older than ``max_age_s``, so a
retired or revoked key stops verifying within that time. Until a ring has been read once
(a reader that started before the extender published the keys: every component of a
fresh install starts at once), every check reads again, after a wait that doubles from
``first_retry_s`` up to ``retry_cap_s``, so the keys are picked up within a second of
being published. It verifies through one
``verifier.DecisionVerifier``, which forgets what it remembered as soon as the ring
read differs from the last one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from gpupool.kube.api import KubeApi
from gpupool.kube.errors import AlreadyExists, Conflict, KubeError, NotFound
from gpupool.kube.verifier import MEMO_LIMIT, DecisionVerifier, MemoStats
from gpupool.security.signing import KeyMaterialError, KeyRing, SigningKeys

log = logging.getLogger(__name__)

SIGNING_SECRET = "gpupool-decision-signing"
PUBLIC_CONFIG_MAP = "gpupool-decision-keys"
ATTEMPTS = 5


def read_signing_keys(kube: KubeApi, namespace: str) -> tuple[SigningKeys, str]:
    """(keys, resourceVersion) of the Secret; ``NotFound`` when it does not exist."""
    data, version = kube.get_secret_data(namespace, SIGNING_SECRET)
    return SigningKeys.from_data(data, f"Secret {namespace}/{SIGNING_SECRET}"), version


def ensure_signing_keys(kube: KubeApi, namespace: str, now: float) -> SigningKeys:
    """The extender's signing keys, made on first start and published."""
    for _ in range(ATTEMPTS):
        try:
            keys, version = read_signing_keys(kube, namespace)
        except NotFound:
            keys, version = SigningKeys(), ""
        if keys.keys:
            publish(kube, namespace, keys)
            return keys
        fresh = keys.added(now)
        try:
            kube.put_secret_data(namespace, SIGNING_SECRET, fresh.to_data(), version or None)
        except (AlreadyExists, Conflict):
            continue  # another replica made it first: read theirs
        log.info("made the first decision signing key %s in Secret %s/%s",
                 fresh.keys[0].kid, namespace, SIGNING_SECRET)
        publish(kube, namespace, fresh)
        return fresh
    raise KubeError(f"Secret {namespace}/{SIGNING_SECRET} kept changing while it was made")


def publish(kube: KubeApi, namespace: str, keys: SigningKeys) -> KeyRing:
    """Make the ConfigMap hold exactly the public halves of ``keys``."""
    ring = keys.public()
    wanted = ring.to_data()
    for _ in range(ATTEMPTS):
        try:
            data, version = kube.get_config_map_data(namespace, PUBLIC_CONFIG_MAP)
        except NotFound:
            data, version = {}, ""
        if data == wanted:
            return ring
        try:
            kube.put_config_map_data(namespace, PUBLIC_CONFIG_MAP, wanted, version or None)
        except (AlreadyExists, Conflict):
            continue
        log.info("published decision keys %s in ConfigMap %s/%s", ", ".join(ring.keys),
                 namespace, PUBLIC_CONFIG_MAP)
        return ring
    raise KubeError(f"ConfigMap {namespace}/{PUBLIC_CONFIG_MAP} kept changing while it was "
                    "written")


def _change(kube: KubeApi, namespace: str,
            edit: Callable[[SigningKeys], SigningKeys]) -> SigningKeys:
    for _ in range(ATTEMPTS):
        keys, version = read_signing_keys(kube, namespace)
        changed = edit(keys)
        try:
            kube.put_secret_data(namespace, SIGNING_SECRET, changed.to_data(), version)
        except Conflict:
            continue
        publish(kube, namespace, changed)
        return changed
    raise KubeError(f"Secret {namespace}/{SIGNING_SECRET} kept changing")


def rotate(kube: KubeApi, namespace: str, now: float, delay_s: float) -> SigningKeys:
    """Add a key that signs from ``now + delay_s``; its public half is published now."""
    return _change(kube, namespace, lambda keys: keys.added(now + delay_s))


def retire(kube: KubeApi, namespace: str, kid: str, now: float) -> SigningKeys:
    """Remove key ``kid`` (never the one signing now, nor the last one)."""
    def edit(keys: SigningKeys) -> SigningKeys:
        if kid not in {k.kid for k in keys.keys}:
            raise KeyMaterialError(f"there is no decision key {kid}")
        if keys.active(now).kid == kid:
            raise KeyMaterialError(f"key {kid} is the one signing now; rotate first")
        return keys.without([kid])
    return _change(kube, namespace, edit)


class KeyRingSource:
    """The published public keys, kept, read again when a decision names an unknown key
    (at most every ``refresh_s``) and when older than ``max_age_s``.

    Thread-safe. ``verify`` raises ``SignatureError`` (an ``InvalidInput``) for a
    decision that must not be served or counted; while the ConfigMap has never been read,
    every decision is refused (fail closed, ``KeyMaterialError``) and the reason says so
    and what to do, and every check reads again after a backoff (``first_retry_s``
    doubling up to ``retry_cap_s``). A read that fails later keeps the ring last read
    (and is tried again at the next check after ``refresh_s``): an API server that
    cannot be reached for a moment does not refuse every decision on every node.
    Outcomes are remembered by one ``DecisionVerifier`` of at most ``memo_limit``
    entries.
    """

    def __init__(self, kube: KubeApi, namespace: str, clock: Callable[[], float],
                 refresh_s: float = 10.0, max_age_s: float = 60.0,
                 memo_limit: int = MEMO_LIMIT, first_retry_s: float = 0.05,
                 retry_cap_s: float = 1.0):
        self.kube = kube
        self.namespace = namespace
        self.clock = clock
        self.refresh_s = refresh_s
        self.max_age_s = max_age_s
        self.first_retry_s = first_retry_s
        self.retry_cap_s = retry_cap_s
        self._lock = threading.Lock()
        self._ring: KeyRing | None = None
        self._read_at = float("-inf")
        self._failures = 0  # reads that failed in a row
        self._good_at = float("-inf")
        self._problem = ""
        self._verifier = DecisionVerifier(self.ring, memo_limit)

    def ring(self, wanted: str | None = None) -> KeyRing:
        """The ring; read again when it was never read (after the backoff), when
        ``wanted`` (a key id) is not in it or when the last good read is older than
        ``max_age_s`` (both at most every ``refresh_s``)."""
        with self._lock:
            now = self.clock()
            stale = self._ring is None or (wanted is not None and wanted not in self._ring) \
                or now - self._good_at >= self.max_age_s
            if stale and now - self._read_at >= self._interval():
                self._read(now)
            if self._ring is None:
                raise KeyMaterialError(
                    f"gpupool's decision keys cannot be read ({self._problem}); the extender "
                    f"publishes them in ConfigMap {self.namespace}/{PUBLIC_CONFIG_MAP} when it "
                    "starts: check that it runs and that this component may get that ConfigMap")
            return self._ring

    def _interval(self) -> float:
        """How long after the last read another may be made: the backoff while no ring was
        ever read, else ``refresh_s``."""
        if self._ring is not None:
            return self.refresh_s
        return min(self.first_retry_s * 2.0 ** max(self._failures - 1, 0), self.retry_cap_s)

    def _read(self, now: float) -> None:
        self._read_at = now
        try:
            data, _ = self.kube.get_config_map_data(self.namespace, PUBLIC_CONFIG_MAP)
            self._ring = KeyRing.from_data(data, f"ConfigMap {self.namespace}/"
                                                 f"{PUBLIC_CONFIG_MAP}")
            self._good_at, self._problem, self._failures = now, "", 0
        except (KubeError, KeyMaterialError) as exc:
            self._problem = str(exc)
            self._failures = min(self._failures + 1, 64)
            log.warning("reading gpupool's decision keys: %s", exc)

    def verify(self, uid: str, namespace: str, name: str, annotations: Mapping[str, str],
               signature: str | None) -> str:
        """The key id that signed the pod's decision; ``SignatureError`` says why not."""
        return self._verifier.verify(uid, namespace, name, annotations, signature)

    def stats(self) -> MemoStats:
        """How the remembered outcomes have served (``DecisionVerifier.stats``)."""
        return self._verifier.stats()
