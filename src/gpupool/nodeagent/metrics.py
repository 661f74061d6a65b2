"""Prometheus metrics of the node agent (its own registry), served on ``/metrics``.

Names and labels (documented in docs/node-agent.md, "Metrics"):

per GPU (label ``gpu``: uuid; the first also ``model``)
  ``gpupool_node_gpu_memory_mib``, ``gpupool_node_gpu_memory_used_mib``,
  ``gpupool_node_gpu_memory_allocated_mib``, ``gpupool_node_gpu_compute_allocated_pct``,
  ``gpupool_node_gpu_utilization_pct``, ``gpupool_node_gpu_healthy`` (1/0),
  ``gpupool_node_gpu_isolated`` (1/0), ``gpupool_node_gpu_slices``,
  ``gpupool_node_mps_daemon_up`` (``mps`` provider only), ``gpupool_node_mps_restarts_total``
per container (``namespace``, ``pod``, ``container``, ``gpu``)
  ``gpupool_node_container_memory_used_mib``, ``gpupool_node_container_memory_limit_mib``,
  ``gpupool_node_container_utilization_pct``, ``gpupool_node_container_compute_limit_pct``,
  ``gpupool_node_container_over_use`` (1 while an over-user),
  ``gpupool_node_container_burst_memory_mib`` (memory held above the request)
node
  ``gpupool_node_isolation_provider{provider, enforced}`` (1 for the node's provider),
  ``gpupool_node_allocate_seconds`` (histogram), ``gpupool_node_allocations_total``,
  ``gpupool_node_refusals_total{reason}``, ``gpupool_node_over_use_actions_total{action}``,
  ``gpupool_node_monitor_sample_seconds`` (histogram),
  ``gpupool_node_monitor_skipped_total{reason}`` (processes or GPUs a sample skipped),
  ``gpupool_node_bursts_total``, ``gpupool_node_burst_reclaims_total{resource}``
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Sequence
from typing import Protocol
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_wsgi_server,
)

from gpupool.nodeagent.gpu import GpuInfo

LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)
CONTAINER = ("namespace", "pod", "container", "gpu")


class NodeMetrics:
    """Every metric of one node agent."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        g = "gpu"
        self.gpu_memory = Gauge("gpupool_node_gpu_memory_mib", "GPU memory", [g, "model"],
                                registry=r)
        self.gpu_used = Gauge("gpupool_node_gpu_memory_used_mib",
                              "GPU memory in use (NVML)", [g], registry=r)
        self.gpu_allocated = Gauge("gpupool_node_gpu_memory_allocated_mib",
                                   "GPU memory held by served slices", [g], registry=r)
        self.gpu_compute = Gauge("gpupool_node_gpu_compute_allocated_pct",
                                 "GPU compute held by served slices (percent)", [g], registry=r)
        self.gpu_util = Gauge("gpupool_node_gpu_utilization_pct", "GPU utilisation (NVML)",
                              [g], registry=r)
        self.gpu_healthy = Gauge("gpupool_node_gpu_healthy", "1 if the GPU is healthy", [g],
                                 registry=r)
        self.gpu_isolated = Gauge("gpupool_node_gpu_isolated",
                                  "1 while the GPU takes no new placements (over-use)", [g],
                                  registry=r)
        self.gpu_slices = Gauge("gpupool_node_gpu_slices", "Containers served on the GPU", [g],
                                registry=r)
        self.mps_up = Gauge("gpupool_node_mps_daemon_up",
                            "1 while the GPU's MPS control daemon serves", [g], registry=r)
        self.mps_restarts = Gauge("gpupool_node_mps_restarts_total",
                                  "Restarts of the GPU's MPS control daemon", [g], registry=r)
        self.c_used = Gauge("gpupool_node_container_memory_used_mib",
                            "GPU memory the container's processes hold", CONTAINER, registry=r)
        self.c_limit = Gauge("gpupool_node_container_memory_limit_mib",
                             "GPU memory of the container's slice", CONTAINER, registry=r)
        self.c_util = Gauge("gpupool_node_container_utilization_pct",
                            "SM utilisation of the container's processes", CONTAINER,
                            registry=r)
        self.c_compute = Gauge("gpupool_node_container_compute_limit_pct",
                               "Compute share of the container's slice", CONTAINER, registry=r)
        self.c_over = Gauge("gpupool_node_container_over_use",
                            "1 while the container uses more than its slice (after the grace)",
                            CONTAINER, registry=r)
        self.c_burst = Gauge("gpupool_node_container_burst_memory_mib",
                             "GPU memory the container holds above its request (a burst)",
                             CONTAINER, registry=r)
        self.bursts = Counter("gpupool_node_bursts_total",
                              "Bursts granted: containers that went above their request",
                              registry=r)
        self.burst_reclaims = Counter("gpupool_node_burst_reclaims_total",
                                      "Bursts reclaimed because a GPU's requests needed the "
                                      "room, by resource", ["resource"], registry=r)
        self.provider = Gauge("gpupool_node_isolation_provider",
                              "The node's isolation provider (enforced=false: advisory)",
                              ["provider", "enforced"], registry=r)
        self.allocate_seconds = Histogram("gpupool_node_allocate_seconds",
                                          "Time to answer one container's Allocate",
                                          buckets=LATENCY_BUCKETS, registry=r)
        self.allocations = Counter("gpupool_node_allocations_total",
                                   "Containers served by Allocate", registry=r)
        self.refusals = Counter("gpupool_node_refusals_total",
                                "Decisions or containers refused, by reason", ["reason"],
                                registry=r)
        self.actions = Counter("gpupool_node_over_use_actions_total",
                               "Actions taken on over-users", ["action"], registry=r)
        self.sample_seconds = Histogram("gpupool_node_monitor_sample_seconds",
                                        "Time of one usage sample", buckets=LATENCY_BUCKETS,
                                        registry=r)
        self.skipped = Counter("gpupool_node_monitor_skipped_total",
                               "Processes or GPUs a usage sample skipped, by reason",
                               ["reason"], registry=r)
        self._containers: set[tuple[str, str, str, str]] = set()
        self._lock = threading.Lock()

    def forget_containers_except(self, live: Iterable[tuple[str, str, str, str]]) -> None:
        """Drop the series of containers no longer sampled."""
        keep = set(live)
        with self._lock:
            gone, self._containers = self._containers - keep, keep
        for labels in gone:
            for gauge in (self.c_used, self.c_limit, self.c_util, self.c_compute, self.c_over,
                          self.c_burst):
                with contextlib.suppress(KeyError):
                    gauge.remove(*labels)


    def set_gpu(self, gpu: GpuInfo, held: Sequence[Held], isolated: bool) -> None:
        """One GPU's gauges: its memory, what the slices held on it take, health."""
        self.gpu_memory.labels(gpu.uuid, gpu.model).set(gpu.memory_mib)
        self.gpu_allocated.labels(gpu.uuid).set(sum(h.memory_mib for h in held))
        self.gpu_compute.labels(gpu.uuid).set(sum(h.core_pct for h in held))
        self.gpu_slices.labels(gpu.uuid).set(len(held))
        self.gpu_healthy.labels(gpu.uuid).set(1 if gpu.healthy else 0)
        self.gpu_isolated.labels(gpu.uuid).set(1 if isolated else 0)


class Held(Protocol):
    """A slice held on a GPU (the device plugin's ``Slice``, a prepared DRA device)."""

    @property
    def memory_mib(self) -> int: ...

    @property
    def core_pct(self) -> int: ...


def serve(metrics: NodeMetrics, address: str, port: int) -> WSGIServer:
    """Serve ``/metrics`` on ``address:port`` in a thread; ``shutdown()`` stops it."""
    server, _ = start_wsgi_server(port, address, registry=metrics.registry)
    return server
