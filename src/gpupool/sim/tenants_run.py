"""What one replay with tenants found (``sim.tenants_replay``): per group, or tenant
without a group, its tally and its GPUs over time; per tenant with a tenant quota or a
permission, what they held back (``sim.tenants_limits``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpupool.sim.tenants_limits import TenantTally


@dataclass(slots=True)
class Tally:
    """What happened to one group (or one tenant without a group)."""

    pods: int = 0
    waits: list[float] = field(default_factory=list)
    preempted: int = 0  # its pods evicted for its own pods of higher priority
    reclaimed: int = 0  # its borrowed pods taken back by lenders
    reclaims: int = 0  # evictions it caused to get its nominal back
    back_s: list[float] = field(default_factory=list)  # a reclaim -> the pod it was for runs
    fair_reclaimed: int = 0  # its borrowed pods taken for a group within its fair share
    fair_reclaims: int = 0  # evictions it caused, within its fair share, from groups beyond


@dataclass(frozen=True, slots=True)
class TenantRun:
    """One replay: per key (group, or tenant without one) its tally, and over time (event
    instants) the GPUs each key holds and borrows."""

    policy: str
    seed: int
    borrowing: bool
    keys: tuple[str, ...]
    nominal_gpus: dict[str, int | None]
    tallies: dict[str, Tally]
    times: tuple[float, ...]
    held: dict[str, tuple[int, ...]]
    borrowed: dict[str, tuple[int, ...]]
    waiting_at_end: dict[str, int]
    last_arrival: float
    wall_s: float
    tenants: dict[str, TenantTally] = field(default_factory=dict)  # tenants with limits
    tenant_held: dict[str, tuple[int, ...]] = field(default_factory=dict)  # GPUs over time
    class_held: dict[tuple[str, str], tuple[int, ...]] = field(default_factory=dict)
    variant: str = ""  # how the run is labelled ("": by ``borrowing``)
