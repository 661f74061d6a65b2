"""Prometheus metrics of the admission webhook (its own registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)
RESOURCES = frozenset({"pods", "pods/status", "pods/ephemeralcontainers", "pods/binding",
                       "pods/eviction", "resourceclasses", "resourcegroups", "tenantquotas",
                       "gpupermissions"})
"""What the shipped webhook configurations send (charts/gpupool's webhooks.yaml)."""
OPERATIONS = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})
OTHER = "other"
"""The ``resource`` or ``operation`` label of a review naming anything else: the labels
come from the request body, and whoever reaches the webhook's port can write any."""


class Metrics:
    """Reviews by endpoint, resource, operation and outcome (``reviewed``); latency; bad
    bodies; TLS."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reviews = Counter("gpupool_webhook_reviews_total",
                               "AdmissionReviews answered, by outcome (allowed, patched, denied)",
                               ["endpoint", "resource", "operation", "outcome"],
                               registry=self.registry)
        self.latency = Histogram("gpupool_webhook_review_seconds",
                                 "Time to answer one AdmissionReview", ["endpoint"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.bad = Counter("gpupool_webhook_bad_requests_total",
                           "Bodies that were no AdmissionReview v1 (answered 400 or denied)",
                           ["endpoint"], registry=self.registry)
        self.errors = Counter("gpupool_webhook_internal_errors_total",
                              "Reviews denied because a rule failed unexpectedly (a bug)",
                              ["endpoint"], registry=self.registry)
        self.not_after = Gauge("gpupool_webhook_certificate_expiry_timestamp_seconds",
                               "When the serving certificate expires (Unix time)",
                               registry=self.registry)
        self.reloads = Counter("gpupool_webhook_certificate_reloads_total",
                               "Serving certificates loaded (first one included)",
                               registry=self.registry)
        self.closed = Counter("gpupool_webhook_connections_closed_total",
                              "Connections the webhook closed, by reason (idle, slow-request, "
                              "header-too-large, recycled, handshake-timeout, "
                              "handshake-recycled)", ["reason"], registry=self.registry)
        self.over_budget = Counter("gpupool_webhook_over_budget_total",
                                   "Reviews answered 429 unread: their body would have taken "
                                   "the bodies held at once past the budget", ["endpoint"],
                                   registry=self.registry)
        self.bundle_writes = Counter("gpupool_webhook_ca_bundle_writes_total",
                                     "caBundle updates written to webhook configurations",
                                     registry=self.registry)

    def reviewed(self, endpoint: str, resource: str, operation: str, outcome: str) -> None:
        """Count one review; a resource or operation not in ``RESOURCES`` / ``OPERATIONS``
        is counted as ``other`` (label values stay bounded whatever bodies arrive)."""
        self.reviews.labels(endpoint, resource if resource in RESOURCES else OTHER,
                            operation if operation in OPERATIONS else OTHER, outcome).inc()
