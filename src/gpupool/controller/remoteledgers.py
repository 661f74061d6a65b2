"""Preemption for remote slices, what the GPULedgers already hold: the live holds that the
planner counts, and the holds whose evictions were never sent (a re-drive). Pure: the
ledgers as read and the time are passed in.

A hold (``gpupool.contract.ledger``: ``kind: hold``) counts, as the extender's cache counts
it, until it expires or its pod is bound (its bind replaced it, or it went elsewhere); the
hold of a pod not in the listing counts too (a pod may be newer than the listing). While it
counts, its room is taken (``count``): the pods it ``displaces`` count nothing and are no
one else's victims, and its slices are held on the planning state. A hold the state cannot
take (it over-commits what the controller sees, e.g. its victims are not where the hold
says) makes its node one the planner does not plan on this round: the room there is
claimed, and its writer's fit check is what counts.

A **re-drive** (``redrives``): a live hold of a pending pod that the controller plans for
(a ``remote-required`` pod that may preempt), written at least ``REDRIVE_S`` ago, some of
whose displaced pods still run on the hold's node and are not leaving. Its writer stopped
between the hold and the evictions (a leader that died); the current leader evicts them.
The extender re-drives its own holds the same way, after the same age.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from gpupool.contract.ledger import Entry, View, gpu_only, live_hold
from gpupool.core.errors import GpupoolError
from gpupool.core.state import ClusterState
from gpupool.core.victims import Candidate

REDRIVE_S = 30.0  # a hold this old whose victims still run lost its evictions (the
# extender's own re-drive age)


@dataclass(frozen=True, slots=True)
class LiveHold:
    """A hold that counts: pod ``uid``'s room on ``node``."""

    uid: str
    node: str
    entry: Entry

    @property
    def pod(self) -> str:
        return self.entry.pod or self.uid


@dataclass(frozen=True, slots=True)
class Counted:
    """What ``count`` did to the state: the pods the holds displace, the nodes whose
    holds the state could not take, and the holds by pod uid."""

    displaced: frozenset[str] = frozenset()
    claimed: frozenset[str] = frozenset()
    holds: Mapping[str, LiveHold] | None = None

    def of(self, uid: str) -> LiveHold | None:
        return (self.holds or {}).get(uid)


def live_holds(views: Mapping[str, View], bound: Collection[str], now: float
               ) -> list[LiveHold]:
    """The holds in ``views`` that count at ``now`` (``bound``: uids of pods bound to a
    node), by node then uid."""
    out = []
    for node in sorted(views):
        for uid, entry in sorted(views[node].entries.items()):
            if live_hold(entry, now) and uid not in bound:
                out.append(LiveHold(uid, node, entry))
    return out


def count(state: ClusterState, holds: Iterable[LiveHold]) -> Counted:
    """Hold ``holds`` on ``state``: each one's displaced pods let go, its slices held."""
    displaced: set[str] = set()
    claimed: set[str] = set()
    by_uid: dict[str, LiveHold] = {}
    for h in holds:
        by_uid[h.uid] = h
        displaced.update(h.entry.displaces)
        for v in h.entry.displaces:
            state.release(v)
        if not _take(state, h):
            claimed.add(h.node)
    return Counted(frozenset(displaced), frozenset(claimed), by_uid)


def _take(state: ClusterState, h: LiveHold) -> bool:
    i = state.index.get(h.node)
    if i is None:
        return False
    try:
        alloc = gpu_only(h.entry.allocation, state.nodes[i])
        if alloc.node != h.node:
            return False
        state.reserve(alloc)
    except GpupoolError:
        return False
    return True


def redrive_due(h: LiveHold, now: float) -> bool:
    """Whether hold ``h`` is old enough that its evictions should have been seen."""
    written = h.entry.bind_s
    return written is not None and now - written >= REDRIVE_S


def stranded(h: LiveHold, running: Iterable[Candidate]) -> list[Candidate]:
    """The pods ``h`` displaces that still run on its node and are not leaving
    (``running``: the placed pods as candidates, leaving marked)."""
    wanted = set(h.entry.displaces)
    return [c for c in running if c.key in wanted and not c.leaving and
            c.allocation.gpu_node == h.node]
