"""Per-GPU telemetry metrics: what the last health reading (``health.GpuReading``) said.

Names are the node agent's own (``gpupool_node_gpu_*``), never NVIDIA's DCGM exporter's
(``DCGM_FI_*``), so both can be scraped side by side; docs/node-agent.md, "Telemetry",
pairs each with its DCGM field. A signal the GPU does not report (``NOT_SUPPORTED``,
``NO_PERMISSION``) has no series; a lost GPU keeps only its health level.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry, Gauge

from gpupool.nodeagent.gpu import GpuInfo
from gpupool.nodeagent.health import CLOCK_EVENTS, GpuReading, Level

_ECC = (("corrected", "volatile", "ecc_volatile_corrected"),
        ("uncorrected", "volatile", "ecc_volatile_uncorrected"),
        ("corrected", "aggregate", "ecc_aggregate_corrected"),
        ("uncorrected", "aggregate", "ecc_aggregate_uncorrected"))
_CLOCKS = (("graphics", "graphics_clock_mhz"), ("sm", "sm_clock_mhz"),
           ("memory", "memory_clock_mhz"))
_LEVELS = {"Healthy": Level.HEALTHY, "Degraded": Level.DEGRADED, "Unhealthy": Level.UNHEALTHY}


class TelemetryMetrics:
    """The telemetry gauges, in the node agent's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        g, r = ("gpu",), registry
        self.level = Gauge("gpupool_node_gpu_health_level",
                           "0 healthy, 1 degraded (serving, with a condition), 2 unhealthy", g,
                           registry=r)
        self.temperature = Gauge("gpupool_node_gpu_temperature_celsius", "GPU temperature", g,
                                 registry=r)
        self.power = Gauge("gpupool_node_gpu_power_watts", "GPU power draw", g, registry=r)
        self.power_limit = Gauge("gpupool_node_gpu_power_limit_watts",
                                 "The GPU's enforced power limit", g, registry=r)
        self.clock = Gauge("gpupool_node_gpu_clock_mhz", "Current clock, by clock",
                           ("gpu", "clock"), registry=r)
        self.fan = Gauge("gpupool_node_gpu_fan_speed_pct", "Fan speed (percent of its most)",
                         g, registry=r)
        self.ecc = Gauge("gpupool_node_gpu_ecc_errors",
                         "ECC errors by type (corrected: single-bit, uncorrected: double-bit) "
                         "and counter (volatile: since the driver loaded, aggregate: lifetime)",
                         ("gpu", "type", "counter"), registry=r)
        self.retired = Gauge("gpupool_node_gpu_retired_pages_pending",
                             "1 while a retired page waits for a GPU reset", g, registry=r)
        self.remap_pending = Gauge("gpupool_node_gpu_remapped_rows_pending",
                                   "1 while a remapped row waits for a GPU reset", g,
                                   registry=r)
        self.remap_failed = Gauge("gpupool_node_gpu_row_remapping_failed",
                                  "1 once row remapping failed", g, registry=r)
        self.clock_event = Gauge("gpupool_node_gpu_clock_event",
                                 "1 while the reason holds the GPU's clocks down",
                                 ("gpu", "reason"), registry=r)
        self.replays = Gauge("gpupool_node_gpu_pcie_replays",
                             "PCIe replays since the driver loaded", g, registry=r)
        self._gauges = (self.temperature, self.power, self.fan, self.retired,
                        self.remap_pending, self.remap_failed, self.replays)

    def export(self, gpus: Sequence[GpuInfo], readings: Iterable[GpuReading]) -> None:
        """Set every GPU's gauges from its latest reading (a missing signal: no series)."""
        for gpu in gpus:
            self.level.labels(gpu.uuid).set(_LEVELS[gpu.level])
            if gpu.facts.power_limit_w:
                self.power_limit.labels(gpu.uuid).set(gpu.facts.power_limit_w)
        for r in readings:
            u = r.uuid
            for gauge, value in zip(self._gauges, (
                    r.temperature_c, r.power_w, r.fan_pct, r.retired_pages_pending,
                    r.remapped_rows_pending, r.remapping_failed, r.pcie_replays), strict=True):
                _set(gauge, (u,), value)
            for kind, counter, attr in _ECC:
                _set(self.ecc, (u, kind, counter), getattr(r, attr))
            for clock, attr in _CLOCKS:
                _set(self.clock, (u, clock), getattr(r, attr))
            for bit, (name, _) in CLOCK_EVENTS.items():
                _set(self.clock_event, (u, name), None if r.clock_events is None
                     else int(bool(r.clock_events & bit)))


def _set(gauge: Gauge, labels: tuple[str, ...], value: float | bool | None) -> None:
    if value is None:
        with contextlib.suppress(KeyError):
            gauge.remove(*labels)
        return
    gauge.labels(*labels).set(float(value))
