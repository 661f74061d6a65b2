"""A GPU's condition from what the driver reports: healthy, degraded or unhealthy.

Pure: ``HealthJudge.judge`` takes one ``GpuReading`` (a poll of NVML, or of the fake
GPU file) and the time, and returns the GPU's level with the reasons. The table
(docs/node-agent.md, "Health") is ``findings``:

=====================================================  ==========  =========================
signal                                                 level       why
=====================================================  ==========  =========================
GPU lost (``NVML_ERROR_GPU_IS_LOST``: off the bus)     Unhealthy   nothing runs on it
NVML cannot query the GPU (any other error)            Unhealthy   it cannot be watched
critical XID (not one an application causes)           Unhealthy   the driver says it failed
uncorrectable (double-bit) ECC, volatile, > 0          Unhealthy   data was corrupted
row remapping failed                                   Unhealthy   memory beyond repair
retired page / remapped row pending (a reset applies)  Degraded    repaired at next reset
correctable (single-bit) ECC, volatile, ≥ threshold    Degraded    memory wearing out
clocks slowed: HW slowdown, HW or SW thermal, power    Degraded    runs slower than asked
brake
PCIe replays ≥ threshold per minute                    Degraded    the link is unreliable
aggregate (lifetime) ECC counters                      Healthy     history: metrics only
clocks held by SW power cap, idle, app clocks, sync    Healthy     normal operation
boost, display
a signal the GPU does not have or we may not read      Healthy     not watched (listed in
(``NOT_SUPPORTED``, ``NO_PERMISSION``)                             ``unsupported``)
=====================================================  ==========  =========================

**Recovery rule**: a GPU takes a worse level at once; it returns to a better one only
after no finding of the worse level for ``recover_after_s`` (a GPU that flaps stays
at its worst). Volatile ECC counters and pending retirements clear only when the GPU
is reset or the driver reloaded, so those GPUs recover only then.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from gpupool.nodeagent.gpu import DEGRADED, HEALTHY, UNHEALTHY

CLOCK_EVENTS = {  # nvmlClocksEventReason* bits -> (name, degrading)
    0x1: ("GpuIdle", False), 0x2: ("ApplicationsClocksSetting", False),
    0x4: ("SwPowerCap", False), 0x8: ("HwSlowdown", True), 0x10: ("SyncBoost", False),
    0x20: ("SwThermalSlowdown", True), 0x40: ("HwThermalSlowdown", True),
    0x80: ("HwPowerBrakeSlowdown", True), 0x100: ("DisplayClockSetting", False)}
"""The clock-event (throttle) reasons NVML reports, and which ones degrade a GPU."""


class Level(IntEnum):
    HEALTHY = 0
    DEGRADED = 1
    UNHEALTHY = 2

    @property
    def spelling(self) -> str:
        return (HEALTHY, DEGRADED, UNHEALTHY)[self]


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One poll of one GPU (None: the GPU does not report it; see ``unsupported``)."""

    uuid: str
    lost: bool = False
    error: str = ""  # NVML could not query the GPU at all
    ecc_volatile_corrected: int | None = None
    ecc_volatile_uncorrected: int | None = None
    ecc_aggregate_corrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_pending: bool | None = None
    remapping_failed: bool | None = None
    clock_events: int | None = None  # nvmlClocksEventReason* bits
    pcie_replays: int | None = None  # since the driver loaded
    temperature_c: int | None = None
    power_w: float | None = None
    graphics_clock_mhz: int | None = None
    sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    fan_pct: int | None = None
    unsupported: tuple[str, ...] = ()  # signals not watched: "ecc (not supported)", ...

    def clock_event_names(self) -> list[str]:
        bits = self.clock_events or 0
        return [name for bit, (name, _) in sorted(CLOCK_EVENTS.items()) if bits & bit]


@dataclass(frozen=True, slots=True)
class HealthConfig:
    recover_after_s: float = 60.0
    corrected_ecc_degraded: int = 1000  # volatile single-bit errors since the driver loaded
    pcie_replays_per_min_degraded: float = 8.0


@dataclass(frozen=True, slots=True)
class Finding:
    level: Level
    message: str


@dataclass(frozen=True, slots=True)
class Verdict:
    """A GPU's level now and why (the reasons of that level)."""

    level: Level
    reasons: tuple[str, ...] = ()

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)


def findings(r: GpuReading, replays_per_min: float | None, config: HealthConfig
             ) -> list[Finding]:
    """Every condition of the table above that the reading shows."""
    if r.lost:
        return [Finding(Level.UNHEALTHY, "the GPU has fallen off the bus "
                                         "(NVML_ERROR_GPU_IS_LOST)")]
    if r.error:
        return [Finding(Level.UNHEALTHY, f"NVML cannot query the GPU: {r.error}")]
    out = []
    if r.ecc_volatile_uncorrected:
        out.append(Finding(Level.UNHEALTHY, f"{r.ecc_volatile_uncorrected} uncorrectable "
                                            "(double-bit) ECC errors since the driver loaded"))
    if r.remapping_failed:
        out.append(Finding(Level.UNHEALTHY, "row remapping failed: the GPU's memory cannot "
                                            "be repaired"))
    if r.retired_pages_pending:
        out.append(Finding(Level.DEGRADED, "a retired memory page waits for a GPU reset"))
    if r.remapped_rows_pending:
        out.append(Finding(Level.DEGRADED, "a remapped memory row waits for a GPU reset"))
    if (r.ecc_volatile_corrected or 0) >= config.corrected_ecc_degraded:
        out.append(Finding(Level.DEGRADED, f"{r.ecc_volatile_corrected} correctable ECC errors "
                                           "since the driver loaded"))
    slowed = [name for bit, (name, bad) in sorted(CLOCK_EVENTS.items())
              if bad and (r.clock_events or 0) & bit]
    if slowed:
        out.append(Finding(Level.DEGRADED, f"clocks slowed: {', '.join(slowed)}"))
    if replays_per_min is not None and replays_per_min >= config.pcie_replays_per_min_degraded:
        out.append(Finding(Level.DEGRADED, f"{replays_per_min:.0f} PCIe replays per minute"))
    return out


@dataclass
class _Track:
    last_at: dict[Level, float] = field(default_factory=dict)
    reasons: dict[Level, tuple[str, ...]] = field(default_factory=dict)
    replays: tuple[float, int] | None = None  # (when, count) of the previous reading


class HealthJudge:
    """Levels with the recovery rule; one per backend (not thread-safe: one poller)."""

    def __init__(self, config: HealthConfig | None = None):
        self.config = config or HealthConfig()
        self._tracks: dict[str, _Track] = {}

    def judge(self, reading: GpuReading, now: float, extra: tuple[Finding, ...] = ()
              ) -> Verdict:
        """The level of ``reading``'s GPU at ``now``; ``extra``: findings from elsewhere
        (a critical XID, a fault injected into a fake GPU)."""
        t = self._tracks.setdefault(reading.uuid, _Track())
        found = [*findings(reading, self._replay_rate(t, reading, now), self.config), *extra]
        for level in (Level.UNHEALTHY, Level.DEGRADED):
            mine = tuple(f.message for f in found if f.level is level)
            if mine:
                t.last_at[level], t.reasons[level] = now, mine
        return self.current(reading.uuid, now)

    def note(self, uuid: str, finding: Finding, now: float) -> Verdict:
        """Record a finding that arrived on its own (an XID event)."""
        t = self._tracks.setdefault(uuid, _Track())
        t.last_at[finding.level], t.reasons[finding.level] = now, (finding.message,)
        return self.current(uuid, now)

    def current(self, uuid: str, now: float) -> Verdict:
        t = self._tracks.get(uuid)
        if t is None:
            return Verdict(Level.HEALTHY)
        for level in (Level.UNHEALTHY, Level.DEGRADED):
            at = t.last_at.get(level)
            if at is not None and (at == now or now - at < self.config.recover_after_s):
                return Verdict(level, t.reasons[level])
        return Verdict(Level.HEALTHY)

    @staticmethod
    def _replay_rate(t: _Track, r: GpuReading, now: float) -> float | None:
        before, t.replays = t.replays, (None if r.pcie_replays is None
                                        else (now, r.pcie_replays))
        if before is None or r.pcie_replays is None or now <= before[0]:
            return None
        return max(r.pcie_replays - before[1], 0) * 60.0 / (now - before[0])
