"""A gang placed whole: slices for all its members together, or for none (docs/gangs.md).

A ``Gang`` is a set of pods (``PodRequest`` members) that are useful only together: at
least ``min_count`` of them must run, and ``together`` may ask them to share one node or
one topology domain (the nodes with the same value of ``domain_label``). ``place_gang``
chooses an allocation for every member it can, all in one pure call:

1. **Eligibility per member** (``constraints_for``: classes, GPU permissions, groups,
   the member's own quota), then **quota for the gang as a whole**
   (``core.gangquota``): the members' charges summed. A gang short of its quorum of
   eligible members, or over a quota, is refused with one reason and places nothing.
2. **Where.** Without ``together``: the whole cluster, once its free compute and GPU
   memory hold the quorum's asks (else nothing is tried). With it, the candidate nodes or
   domains whose free compute and GPU memory (summed over their healthy GPUs) hold the
   quorum's asks, the tightest first (the packing idea applied to the set: a small gang
   does not take a big domain a bigger gang could use), ties by name; at most
   ``max_domains`` are tried.
3. **The packing policy applied to the set.** On a scratch copy of the state the members
   are placed one after the other by the placer's policy, the largest GPU ask first (ties:
   member order), each seeing the slices of the members placed before it, so no two
   members ever share a slice beyond a GPU's capacity. A member that fits nowhere waits;
   the first domain where at least ``min_count`` members fit wins.
4. **The result**: the allocations (member order) and the members that wait, or the
   reason nothing was placed. The state is not changed: the caller reserves the
   allocations, all or none (``reserve_gang``), and charges each one.

Deterministic: the same state, gang and policy give the same placement (``rng`` reaches
only policies that draw from it, as in ``Placer.decide``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from gpupool.core.allocation import Allocation
from gpupool.core.eligibility import Catalogue, charge_of, constraints_for, request_amount
from gpupool.core.errors import InvalidInput, OverCommit
from gpupool.core.fit import NO_CONSTRAINTS, Constraints, demand_of
from gpupool.core.gangquota import gang_refusal
from gpupool.core.model import CORE_UNITS_PER_GPU
from gpupool.core.placement import Placer
from gpupool.core.quota import Charge
from gpupool.core.reasons import Check, Reason
from gpupool.core.request import PodRequest
from gpupool.core.scoring import Policy
from gpupool.core.serving import ZONE_LABEL
from gpupool.core.state import ClusterState, IntArray

MAX_DOMAINS = 256
"""Nodes or domains tried for a gang asked to stay together (the tightest first)."""

Rule = Callable[[ClusterState, PodRequest], Constraints]
"""A member's constraints (default: ``constraints_for`` with the catalogue); a caller
with rules of its own (an adapter taking nodes out) passes them."""


class Together(Enum):
    """Where a gang's members must be, relative to each other."""

    ANYWHERE = "anywhere"
    NODE = "node"  # all on one node
    DOMAIN = "domain"  # all on nodes with one value of the gang's domain label


@dataclass(frozen=True, slots=True)
class Gang:
    """Pods placed all or nothing: at least ``min_count`` of ``members`` (0: all)."""

    name: str
    members: tuple[PodRequest, ...]
    min_count: int = 0
    together: Together = Together.ANYWHERE
    domain_label: str = ZONE_LABEL

    def __post_init__(self) -> None:
        if not self.members:
            raise InvalidInput(f"gang {self.name}: a gang needs members")
        keys = [m.key for m in self.members]
        if len(set(keys)) != len(keys):
            raise InvalidInput(f"gang {self.name}: two members have the same key")
        if not 0 <= self.min_count <= len(self.members):
            raise InvalidInput(f"gang {self.name}: minCount {self.min_count} must be "
                               f"1..{len(self.members)} (its members)")
        if self.together is Together.DOMAIN and not self.domain_label:
            raise InvalidInput(f"gang {self.name}: a topology domain needs a node label")

    @property
    def quorum(self) -> int:
        """How many members must be placed (``min_count``, or all of them)."""
        return self.min_count or len(self.members)


@dataclass(frozen=True, slots=True)
class GangPlacement:
    """The outcome: allocations for at least the quorum (the others wait), or why none."""

    gang: Gang
    allocations: tuple[Allocation, ...] = ()
    waiting: tuple[str, ...] = ()  # members not placed (beyond the quorum, or all)
    where: str = ""  # the node or domain (``label=value``) chosen when asked to stay together
    reason: Reason | None = None
    charges: tuple[Charge, ...] = field(default=())  # per allocation, to charge once reserved

    @property
    def ok(self) -> bool:
        return self.reason is None

    def summary(self) -> str:
        g = self.gang
        if self.reason is not None:
            return f"gang {g.name}: nothing placed: {self.reason.message}"
        where = f" on {self.where}" if self.where else ""
        wait = f"; {len(self.waiting)} wait" if self.waiting else ""
        return f"gang {g.name}: {len(self.allocations)} of {len(g.members)} placed{where}{wait}"


def place_gang(state: ClusterState, gang: Gang, policy: Policy, rng: random.Random,
               catalogue: Catalogue | None = None, max_domains: int = MAX_DOMAINS,
               rule: Rule | None = None) -> GangPlacement:
    """Slices for ``gang``'s members together (see the module); never changes ``state``.
    ``rule``: each member's constraints, instead of ``constraints_for``."""
    ruled = member_rules(state, gang, catalogue, rule)
    eligible = [i for i, c in enumerate(ruled) if c.blocked is None]
    if len(eligible) < gang.quorum:
        first = next(c.blocked for c in ruled if c.blocked is not None)
        return _refused(gang, first, f"{len(gang.members) - len(eligible)} of its members "
                        f"may not be placed ({first.message})")
    asks = {i: ask_of(state, gang.members[i]) for i in eligible}
    order = placing_order(state, gang, ruled)
    refusal = _quota(state, gang, order[:gang.quorum], ruled, catalogue)
    if refusal is not None:
        return GangPlacement(gang, reason=refusal)
    trial = _Trial(state, gang, order, ruled, Placer(policy), rng)
    if gang.together is Together.ANYWHERE:
        if not _has_room(state, [asks[i] for i in order[:gang.quorum]]):
            return _refused(gang, None, f"the cluster's free GPU compute or memory is less "
                            f"than its {gang.quorum} members ask together")
        return trial.outcome(trial.place(None), "", catalogue)
    tried = 0
    for where, rows in _domains(state, gang, order):
        if tried == max_domains:
            break
        tried += 1
        found = trial.place(rows)
        if len(found) >= gang.quorum:
            return trial.outcome(found, where, catalogue)
    scope = "node" if gang.together is Together.NODE else f"domain of {gang.domain_label}"
    return _refused(gang, None, f"no {scope} holds {gang.quorum} of its members together "
                    f"({tried} with room enough tried)")


def member_rules(state: ClusterState, gang: Gang, catalogue: Catalogue | None,
                 rule: Rule | None = None) -> list[Constraints]:
    """Each member's constraints: ``rule``'s, else ``constraints_for`` the catalogue's."""
    return [rule(state, m) if rule is not None else constraints_for(state, m, catalogue)
            if catalogue is not None else NO_CONSTRAINTS for m in gang.members]


def placing_order(state: ClusterState, gang: Gang, ruled: Sequence[Constraints]) -> list[int]:
    """The members that may be placed (indexes), in the order they are placed: the
    largest GPU ask first, ties in member order."""
    asks = {i: ask_of(state, m) for i, m in enumerate(gang.members)
            if ruled[i].blocked is None}
    return sorted(asks, key=lambda i: (-asks[i][0], -asks[i][1], i))


def exact_outcome(gang: Gang, found: Mapping[int, Allocation], ruled: Sequence[Constraints],
                  where: str, catalogue: Catalogue | None) -> GangPlacement:
    """The placement of the members ``found`` (index -> allocation, the quorum at least):
    their charges, checked together against the gang's quota once more (whole GPUs as
    chosen), and the members that wait."""
    ordered = sorted(found)
    charges = tuple(charge_of(gang.members[i], found[i], ruled[i]) for i in ordered)
    if catalogue is not None:
        refusal = gang_refusal(gang.name, charges, catalogue)
        if refusal is not None:
            return GangPlacement(gang, reason=refusal)
    waiting = tuple(m.key for i, m in enumerate(gang.members) if i not in found)
    return GangPlacement(gang, tuple(found[i] for i in ordered), waiting, where, None, charges)


def reserve_gang(state: ClusterState, placed: GangPlacement) -> None:
    """Reserve every allocation of ``placed``, or none: ``OverCommit`` (nothing changed)
    when the state moved since and one no longer fits."""
    done: list[str] = []
    try:
        for alloc in placed.allocations:
            state.reserve(alloc)
            done.append(alloc.key)
    except (OverCommit, InvalidInput):
        for key in done:
            state.release(key)
        raise


class _Trial:
    """Places the members in order on a fresh scratch copy per try."""

    def __init__(self, state: ClusterState, gang: Gang, order: list[int],
                 ruled: list[Constraints], placer: Placer, rng: random.Random):
        self.state, self.gang, self.order, self.ruled = state, gang, order, ruled
        self.placer, self.rng = placer, rng
        self.missed: Reason | None = None

    def place(self, rows: IntArray | None) -> dict[int, Allocation]:
        scratch = self.state.snapshot().state()
        found: dict[int, Allocation] = {}
        for n, i in enumerate(self.order):
            if len(found) + len(self.order) - n < self.gang.quorum:
                break  # the quorum is out of reach: the rest need not be tried
            member = self.gang.members[i]
            decided = self.placer.decide(scratch, member, self.rng, self.ruled[i], rows,
                                         explain_limit=1)
            if decided.allocation is None:
                self.missed = self.missed or _missed(member, decided.reasons)
                continue
            scratch.reserve(decided.allocation)
            found[i] = decided.allocation
        return found

    def outcome(self, found: dict[int, Allocation], where: str,
                catalogue: Catalogue | None) -> GangPlacement:
        gang = self.gang
        if len(found) < gang.quorum:
            why = self.missed.message if self.missed is not None else "no room"
            return _refused(gang, self.missed, f"only {len(found)} of its members fit together, "
                            f"{gang.quorum} needed (e.g. {why})")
        return exact_outcome(gang, found, self.ruled, where, catalogue)


def _quota(state: ClusterState, gang: Gang, quorum: Sequence[int], ruled: list[Constraints],
           catalogue: Catalogue | None) -> Reason | None:
    if catalogue is None:
        return None
    charges = [Charge(request_amount(state, gang.members[i], ruled[i].gpu_mask),
                      gang.members[i].tenant, gang.members[i].gpu_class, ruled[i].group)
               for i in quorum]
    return gang_refusal(gang.name, charges, catalogue)


def _domains(state: ClusterState, gang: Gang, order: list[int]
             ) -> list[tuple[str, IntArray]]:
    """Candidate nodes or domains whose free compute and memory (summed over healthy GPUs)
    hold the quorum's (a necessary condition only), the tightest first."""
    ok = state.present & state.healthy
    cores = np.where(ok, state.core_free, 0).sum(1)
    units = np.where(ok, state.unit_free, 0).sum(1)
    need = np.sum([ask_of(state, gang.members[i]) for i in order[:gang.quorum]], axis=0)
    groups = domain_groups(state, gang)
    room = {name: (int(cores[rows].sum()), int(units[rows].sum()))
            for name, rows in groups.items()}
    chosen = sorted((r, name) for name, r in room.items()
                    if r[0] >= need[0] and r[1] >= need[1])
    return [(name, np.asarray(groups[name], np.int64)) for _, name in chosen]


def domain_groups(state: ClusterState, gang: Gang) -> dict[str, list[int]]:
    """The nodes (rows) of each node or domain a gang ``together`` may be placed on, by
    name (``label=value`` for a domain; nodes without the label are in none)."""
    groups: dict[str, list[int]] = {}
    for i, node in enumerate(state.nodes):
        if gang.together is Together.NODE:
            groups[node.name] = [i]
            continue
        value = dict(node.labels).get(gang.domain_label)
        if value is not None:
            groups.setdefault(f"{gang.domain_label}={value}", []).append(i)
    return groups


def _has_room(state: ClusterState, asks: Sequence[tuple[int, int]]) -> bool:
    """Whether the cluster's free compute and memory (healthy GPUs) hold ``asks`` summed:
    a necessary condition, checked before any member is tried."""
    ok = state.present & state.healthy
    return int(np.where(ok, state.core_free, 0).sum()) >= sum(a[0] for a in asks) and \
        int(np.where(ok, state.unit_free, 0).sum()) >= sum(a[1] for a in asks)


def ask_of(state: ClusterState, member: PodRequest) -> tuple[int, int]:
    """The member's GPU ask summed over its GPUs: (compute %, memory units); a whole GPU
    counts 100 % and no memory (the least any GPU would take of it)."""
    demand = demand_of(member)
    if demand is None:
        return 0, 0
    if demand.exclusive:
        return demand.count * CORE_UNITS_PER_GPU, 0
    return demand.count * demand.core_pct, demand.count * state.units_for(demand.memory_mib)


def _missed(member: PodRequest, reasons: Sequence[Reason]) -> Reason:
    why = reasons[0].common() if reasons else "no node has room"
    return Reason("", Check.GPU_FREE, f"member {member.key}: {why}", False)


def _refused(gang: Gang, cause: Reason | None, message: str) -> GangPlacement:
    permanent = cause.permanent if cause is not None else False
    check = cause.check if cause is not None else Check.GPU_FREE
    return GangPlacement(gang, reason=Reason("", check, f"gang {gang.name}: {message}",
                                             permanent))
