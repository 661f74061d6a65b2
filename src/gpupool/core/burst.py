"""The burst rule: when a GPU's requests need the room bursts hold, and whose burst goes.

A burstable slice (docs/design/burst.md) may use more than its request, up to its limit,
while its GPU has room. The node agent's usage monitor (``nodeagent.burst``) and the
simulator (``sim.bursts``) apply the same two rules:

* **short**: the room a GPU lacks for every slice on it to reach its request, in one
  dimension: ``other + Σ max(used, request) − capacity`` (never below 0), ``other`` being
  use no slice accounts for;
* **reclaim order**: bursts are taken back most recent first (the one that started last;
  ties by key), each freeing its use above its request, until the shortfall is covered.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K")


@dataclass(frozen=True, slots=True)
class Bursting(Generic[K]):
    """One slice above its request on a GPU: ``above`` (MiB or %) since ``since``."""

    key: K
    since: float
    above: int


def short(capacity: int, uses: Iterable[tuple[int, int]], other: int = 0) -> int:
    """What a GPU lacks for each (used, request) slice on it to reach its request."""
    return max(other + sum(max(used, request) for used, request in uses) - capacity, 0)


def reclaim(bursts: Sequence[Bursting[K]], lacking: int) -> list[tuple[Bursting[K], int]]:
    """The bursts to take back for ``lacking`` (most recent first), each with what the GPU
    still lacked before it."""
    out = []
    for burst in sorted(bursts, key=lambda b: (-b.since, str(b.key))):
        if lacking <= 0:
            break
        if burst.above <= 0:
            continue
        out.append((burst, lacking))
        lacking -= burst.above
    return out
