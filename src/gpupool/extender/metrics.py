"""Prometheus metrics of one extender (its own registry, so replicas can share a process)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)
STAGE_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0, 5.0)
BIND_STAGES = ("parse", "gate", "decide", "node-queue", "ledger", "quota", "sign", "binding",
               "cleanup")
"""A bind's stages, in order (``gpupool_extender_bind_stage_seconds``; docs/operations.md)."""


class Metrics:
    """Request latency per verb, decisions, failures by reason, GPUs allocated, decisions
    not counted, preemptions."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram("gpupool_extender_request_seconds",
                                 "Time to answer one extender call", ["verb"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.decisions = Counter("gpupool_extender_decisions_total",
                                 "Extender answers by verb and outcome", ["verb", "outcome"],
                                 registry=self.registry)
        self.failures = Counter("gpupool_extender_node_failures_total",
                                "Nodes refused by filter, by the reason's check", ["reason"],
                                registry=self.registry)
        self.bind_stages = Histogram("gpupool_extender_bind_stage_seconds",
                                     "Time one bind spent in each stage, its retries summed: "
                                     + ", ".join(BIND_STAGES), ["stage"],
                                     buckets=STAGE_BUCKETS, registry=self.registry)
        self.assumptions = Counter("gpupool_extender_assumptions_total",
                                   "Placements assumed for a pod until its bind, by how they "
                                   "ended: made, bound (the bind took that node), moved (the "
                                   "bind named another node), expired, yielded (a record of "
                                   "the cluster needed the room)", ["outcome"],
                                   registry=self.registry)
        self.conflicts = Counter("gpupool_extender_ledger_conflicts_total",
                                 "GPU ledger writes that lost a race and were retried",
                                 registry=self.registry)
        self.gpus_allocated = Gauge("gpupool_gpus_allocated",
                                    "Allocated GPU share in whole GPUs (milli-GPU / 1000)",
                                    registry=self.registry)
        self.gpus_total = Gauge("gpupool_gpus", "GPUs the extender knows", registry=self.registry)
        self.unverified = Counter("gpupool_extender_unverified_decisions_total",
                                  "Pods whose recorded decision is not counted (once per pod), "
                                  "by reason: unsigned, invalid, unknown-key, not-a-gpu-pod",
                                  ["reason"], registry=self.registry)
        self.refused_bodies = Counter("gpupool_extender_refused_requests_total",
                                      "Calls refused unread: body over its limit or the budget",
                                      ["verb"], registry=self.registry)
        self.preemptions = Counter("gpupool_extender_preemptions_total",
                                   "Preemptions for GPU pods by outcome: started, "
                                   "no-victims, held, refused, abandoned, failed",
                                   ["outcome"], registry=self.registry)
        self.preempted = Counter("gpupool_extender_preempted_pods_total",
                                 "Pods evicted to make room for pods of higher priority",
                                 registry=self.registry)
        self.closed = Counter("gpupool_extender_connections_closed_total",
                              "Connections the extender closed, by reason: client-certificate, "
                              "idle, slow-request, header-too-large, recycled", ["reason"],
                              registry=self.registry)
        self.tenant_preemptions = Counter("gpupool_extender_tenant_preemptions_total",
                                          "Preemptions started inside a tenant's quota "
                                          "(kind priority) or to take back what a tenant lent "
                                          "its cohort (kind reclaim)", ["tenant", "kind"],
                                          registry=self.registry)
        self.stale_plans = Counter("gpupool_extender_preemption_stale_plans_total",
                                   "Preemption plans that no longer held when committed (the "
                                   "cluster changed while they were made off the cache lock), "
                                   "by what followed: replanned, dropped", ["then"],
                                   registry=self.registry)


class BindClock:
    """The stages of one bind: ``lap`` charges the time since the last lap to a stage
    (a stage met again, on a retry, adds up); ``done`` observes each stage met once."""

    def __init__(self, histogram: Histogram | None = None):
        self.histogram = histogram
        self.spent: dict[str, float] = {}
        self.last = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.spent[stage] = self.spent.get(stage, 0.0) + now - self.last
        self.last = now

    def done(self) -> None:
        if self.histogram is not None:
            for stage, seconds in self.spent.items():
                self.histogram.labels(stage).observe(seconds)
