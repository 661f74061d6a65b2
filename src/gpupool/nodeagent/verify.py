"""Which decisions the node agent may serve and count: only those gpupool's scheduler made.

A pod author can write any annotation and set ``spec.nodeName``, so a decision in a
pod's annotations proves nothing by itself. The extender signs every decision (see
``gpupool.security.signing``); ``DecisionGate.check`` serves or counts a decision only
when

* the pod asks a gpupool GPU resource at all (a decision on a CPU-only pod is refused:
  kubelet never calls Allocate for it, yet counting it would block a GPU), and
* its signature verifies for this pod (uid, namespace, name), the node, the bind time,
  the resource group and the allocation, byte for byte, with one of gpupool's
  published keys.

An Allocate asks ``DecisionGate.settled``: a refusal that may pass soon — the keys not read
yet (a node agent that started before the extender published them), or a key this node
has not read yet — is checked again until it passes or ``patience_s`` is over, so a pod
is refused only when the keys are really absent (kubelet fails a refused pod for good).

Results are values (``Verdict``). The gate remembers nothing itself: the ``Verifier``
it is given (``KeyRingSource.verify``, wired by the CLI) checks and remembers through
``gpupool.kube.verifier.DecisionVerifier``, the one verifier the extender and the
controller use too — per exact signed bytes, signature and key ring, never per uid
alone, forgotten at once when the published keys change — so an Allocate re-checks the
~40 decisions of a node without a signature check each. With verification off
(``--decide-unscheduled``, for clusters without the extender) every decision counts, as
before signing existed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpupool.contract import names
from gpupool.nodeagent.pods import Pod
from gpupool.security.signing import KeyMaterialError, SignatureError

Verifier = Callable[[str, str, str, Mapping[str, str], str | None], str]
"""``KeyRingSource.verify``: (uid, namespace, name, annotations, signature) -> key id;
raises ``SignatureError`` for a decision that must not be served, ``KeyMaterialError``
while the published keys cannot be read."""

MEMO_LIMIT = 20_000
"""Outcomes a node agent's verifier remembers (``KeyRingSource(memo_limit=...)``): a node
runs ~110 pods at most, so this bounds only churn and hostile edits."""

PATIENCE_S = 5.0
"""How long an Allocate waits for decision keys being published. kubelet sets no deadline
on Allocate, but it admits a node's pods one at a time while it waits (and gives
PreStartContainer 30 s), so the wait stays short; the keys' reader retries at least every
second meanwhile (``KeyRingSource``'s backoff)."""
POLL_S = 0.1
"""How often a waiting Allocate checks again (each check reads the keys only when the
reader's backoff allows)."""

# refusal codes (metric label ``reason``; sentences carry the details)
NO_GPU_REQUEST = "no-gpu-request"
UNSIGNED = "unsigned"
BAD_SIGNATURE = "bad-signature"
UNKNOWN_KEY = "unknown-key"
KEYS_UNAVAILABLE = "keys-unavailable"


@dataclass(frozen=True, slots=True)
class Verdict:
    """``ok``, or a refusal: a ``code`` for metrics and a sentence a person can act on.

    ``definite`` refusals (forged, edited, copied, on a CPU-only pod) can be recorded on
    the pod at once; a refusal because the keys cannot be read now, or because the
    decision names a key this node has not read yet, is not definite (an Allocate still
    refuses it, after reading the keys again).
    """

    ok: bool
    code: str = ""
    reason: str = ""
    definite: bool = True


OK = Verdict(True)


class DecisionGate:
    """Verifies pods' decisions for one node; thread-safe."""

    def __init__(self, node: str, verifier: Verifier | None, patience_s: float = PATIENCE_S,
                 sleep: Callable[[float], None] = time.sleep,
                 monotonic: Callable[[], float] = time.monotonic):
        self.node = node
        self.verifier = verifier
        self.patience_s = patience_s
        self._sleep = sleep
        self._monotonic = monotonic

    @property
    def enabled(self) -> bool:
        return self.verifier is not None

    def check(self, pod: Pod) -> Verdict:
        """May ``pod``'s decision be served or counted here? (A pod without one: ``OK``.)"""
        if names.ANNOTATION_ALLOCATION not in pod.annotations:
            return OK
        if not pod.asks_gpu:
            return Verdict(False, NO_GPU_REQUEST, f"pod {pod.ref} carries a gpupool decision "
                           "but none of its containers asks a gpupool GPU resource")
        if self.verifier is None:
            return OK
        return self._signed(pod)

    def deadline(self) -> float:
        """Until when (``monotonic``) an Allocate starting now waits: ``settled``'s limit."""
        return self._monotonic() + self.patience_s

    def settled(self, pod: Pod, deadline: float) -> Verdict:
        """``check(pod)``, checked again every ``POLL_S`` while it is a refusal that may pass
        soon (not ``definite``) and ``deadline`` has not come."""
        verdict = self.check(pod)
        while not verdict.ok and not verdict.definite:
            left = deadline - self._monotonic()
            if left <= 0:
                return self._waited(verdict)
            self._sleep(min(POLL_S, left))
            verdict = self.check(pod)
        return verdict

    def _waited(self, verdict: Verdict) -> Verdict:
        if verdict.code != KEYS_UNAVAILABLE:
            return verdict
        return Verdict(False, verdict.code, f"{verdict.reason} (waited {self.patience_s:g} s "
                       "for them; re-create the pod once they are readable)", definite=False)

    def trusted(self, pod: Pod) -> bool:
        """``check(pod).ok`` (for counting what other pods hold)."""
        return self.check(pod).ok

    def _signed(self, pod: Pod) -> Verdict:
        assert self.verifier is not None
        try:
            self.verifier(pod.uid, pod.namespace, pod.name, pod.annotations, pod.signature)
        except KeyMaterialError as exc:
            return Verdict(False, KEYS_UNAVAILABLE, str(exc), definite=False)
        except SignatureError as exc:
            code = _CODES.get(exc.code, BAD_SIGNATURE)  # a key published seconds ago may
            # not be read here yet: not a definite refusal
            return Verdict(False, code, str(exc), definite=code != UNKNOWN_KEY)
        return OK


_CODES = {SignatureError.UNSIGNED: UNSIGNED, SignatureError.UNKNOWN_KEY: UNKNOWN_KEY}
