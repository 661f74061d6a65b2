"""Signature checks of decisions, remembered between rounds.

The controller reconciles the whole cluster every round; checking every decision's
Ed25519 signature each time would cost ~0.1 ms per pod. ``RememberedVerify`` keeps the
key id of each decision that verified, keyed by everything the signature covers plus
the signature itself (never by uid alone: an edited or copied decision is a new key
and is checked afresh). Failures are not remembered (a key published later, or a
ConfigMap that could not be read, may make the same decision verify next round).
Entries not used during a round are dropped when the next one starts.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from gpupool.contract import names
from gpupool.controller.observed import Verify

_COVERED = (names.ANNOTATION_NODE, names.ANNOTATION_BIND_TIME, names.ANNOTATION_RESOURCE_GROUP,
            names.ANNOTATION_ALLOCATION, names.ANNOTATION_SIGNATURE)


class RememberedVerify:
    """A ``Verify`` that remembers successes (thread-safe)."""

    def __init__(self, verify: Verify):
        self._verify = verify
        self._lock = threading.Lock()
        self._known: dict[tuple[str, ...], str] = {}
        self._used: dict[tuple[str, ...], str] = {}

    def __call__(self, uid: str, namespace: str, name: str, annotations: Mapping[str, str],
                 signature: str | None) -> str:
        key = (uid, namespace, name, *(annotations.get(k, "") for k in _COVERED))
        with self._lock:
            kid = self._known.get(key) or self._used.get(key)
        if kid is None:
            kid = self._verify(uid, namespace, name, annotations, signature)
        with self._lock:
            self._used[key] = kid
        return kid

    def new_round(self) -> None:
        """Forget what the last round did not use."""
        with self._lock:
            self._known, self._used = self._used, {}

    def __len__(self) -> int:
        with self._lock:
            return len(set(self._known) | set(self._used))
