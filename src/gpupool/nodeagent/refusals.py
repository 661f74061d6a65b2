"""Refusals: the error a refused Allocate raises, and how a refusal is recorded.

A refused decision is recorded on the pod — phase ``failed`` with ``gpupool.io/reason``
— and as a Kubernetes Event (reason ``GpupoolRefused``, type Warning) about the pod,
counted in ``gpupool_node_refusals_total{reason}`` and logged; nothing is served.
"""

from __future__ import annotations

import logging

from gpupool.contract import annotations as contract
from gpupool.contract import names
from gpupool.core.errors import GpupoolError
from gpupool.nodeagent.cluster import EventApi, PodApi
from gpupool.nodeagent.metrics import NodeMetrics
from gpupool.nodeagent.pods import Pod
from gpupool.nodeagent.verify import DecisionGate

log = logging.getLogger(__name__)

EVENT_REFUSED = "GpupoolRefused"


class Refused(GpupoolError):
    """An Allocate or PreStartContainer the agent will not serve; the message says why and
    ``code`` names the reason for metrics (``gpupool_node_refusals_total{reason}``)."""

    def __init__(self, message: str, code: str = "refused"):
        super().__init__(message)
        self.code = code


class RefusalRecorder:
    """Marks refused pods ``failed``, records an Event and counts the refusal."""

    def __init__(self, pods: PodApi, events: EventApi | None = None,
                 metrics: NodeMetrics | None = None):
        self.pods = pods
        self.events = events
        self.metrics = metrics

    def count(self, code: str) -> None:
        if self.metrics is not None:
            self.metrics.refusals.labels(code).inc()

    def record(self, pod: Pod, reason: str, code: str) -> None:
        """Phase ``failed`` + ``gpupool.io/reason``, an Event, a count, a log line."""
        log.warning("refused pod %s (%s): %s", pod.ref, code, reason)
        self.count(code)
        if pod.annotations.get(names.ANNOTATION_PHASE) != names.PHASE_FAILED:
            try:
                self.pods.patch_annotations(pod, contract.phase_patch(names.PHASE_FAILED,
                                                                      reason))
            except GpupoolError as exc:
                log.warning("could not mark pod %s failed: %s", pod.ref, exc)
        if self.events is not None:
            self.events.pod_event(pod, EVENT_REFUSED, reason)


def audit(pods: list[Pod], gate: DecisionGate, recorder: RefusalRecorder) -> int:
    """Record the refusal of every decision on the node that can never be served (forged,
    copied, edited, unsigned, on a pod that asks no GPU) — also for pods kubelet never
    calls Allocate for. Refusals that may pass later (keys unreadable, a key id not read
    yet) are left alone.
    Returns how many were recorded."""
    n = 0
    for pod in pods:
        if not pod.active or pod.deleting or \
                pod.annotations.get(names.ANNOTATION_PHASE) == names.PHASE_FAILED:
            continue
        verdict = gate.check(pod)
        if not verdict.ok and verdict.definite:
            recorder.record(pod, verdict.reason, verdict.code)
            n += 1
    return n
