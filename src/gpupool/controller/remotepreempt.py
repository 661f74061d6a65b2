"""Preemption for remote slices, the plan: which pods of lower priority to evict so that a
pending ``remote-required`` pod's slice has room on some GPU node (docs/remote.md,
"Preemption for a remote slice"; docs/design/remote.md says why the controller does it).

``RemotePlanner.plan`` is pure (the time is passed in) and remembers between rounds what
it asked and what became of it. Each round:

1. **The state**: the published GPUs with every counted decision held (a remote slice on
   its serving node, its pod's home included as a node without GPUs); the pods leaving
   (being deleted, or evicted and not yet seen deleted) are let go at once, so their room
   is free; then the live holds in the GPULedgers (``remoteledgers``: not expired, their
   pod not bound) take their room, and the pods they displace count nothing and are
   nobody's victims (a node whose hold the state cannot take is not planned on this
   round); then the room promised to earlier preemptors still pending is held for them
   again (a promise whose room another pod took is dropped, and its pod planned afresh).
   A preemptor with a live hold of its own is not planned: its room is held; once the
   hold is ``REDRIVE_S`` old with displaced pods still running and not leaving, those are
   its victims again (``written``: a re-drive, no second hold).
2. **The preemptors** (``remotewaiting.waiting``), highest priority first, then oldest.
   For each: its constraints (``core.eligibility.constraints_for``: class, selector,
   permissions, quotas, group; a refusal is not helped by evicting anyone), and its slice
   alone (``serving.slice_of``: the home gives CPU and memory). A slice that has room now
   needs nobody: it is held on the scratch state so that the next pod does not count the
   same room. Otherwise the core chooses (``core.victims.select`` with ``Room`` and
   ``below(priority)``: the fewest pods of strictly lower priority, then the lowest
   priorities, ...), tier by tier in ``ServingPlacer``'s order as seen from the nodes the
   pod may run on (``Waiting.admits``: its ``spec.nodeSelector`` and required node
   affinity over the nodes' names and labels; taints are not read): those nodes
   themselves, then the nodes of their topology domains (most specific label first),
   then any node; the first tier with an answer wins. The victims leave the scratch
   state and the slice is held there on the node they free (placed by the core's
   ``Placer``), so two pods of one round never count one freed GPU twice.
3. **The cap**: at most ``per_minute`` evictions start per minute, cluster-wide; a plan
   that would pass it waits whole for a later round (its room stays held on the scratch
   state for this round). A victim whose eviction was refused (a PodDisruptionBudget's
   429) is not chosen again for ``retry_s``, then may be chosen (and tried) again.

Pods of a gang are never victims (a single pod does not evict a gang). The victims'
PodDisruptionBudgets are not read: the Eviction API refuses what they do not allow.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from gpupool.contract.ledger import View
from gpupool.controller import remoteledgers, remotewaiting
from gpupool.controller.figures import cluster_state
from gpupool.controller.observed import Observed
from gpupool.controller.remoteledgers import Counted, LiveHold
from gpupool.controller.remotewaiting import Skip, Waiting
from gpupool.core.allocation import Allocation
from gpupool.core.eligibility import Catalogue, constraints_for
from gpupool.core.errors import GpupoolError
from gpupool.core.fit import NO_CONSTRAINTS, Constraints, feasible
from gpupool.core.model import Labels
from gpupool.core.placement import Placer
from gpupool.core.policies import make_policy
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.serving import ZONE_LABEL, slice_of
from gpupool.core.state import ClusterState
from gpupool.core.victims import Candidate, Limits, NoVictims, Room, below, select

ROOMY = 10**12  # nodes' CPU and memory: the home gives them, and the controller does not watch them
POLICY = "best-fit"  # where, on the node the victims free, the slice is held on the scratch state


@dataclass(frozen=True, slots=True)
class PreemptionConfig:
    """``grace_s``: how long kube-scheduler must have found no node for a pod;
    ``per_minute``: evictions started per minute, cluster-wide; ``retry_s``: when a refused
    eviction may be tried again; ``promise_s``: how long the room made for a pod is kept
    for it while it stays pending; ``domains``: the topology labels, most specific first
    (the extender's ``--topology-labels``); ``hold_s``: how long the hold written in the
    serving node's GPULedger keeps the room made for a pod (the extender's
    ``--preemption-hold``)."""

    enabled: bool = True
    grace_s: float = 30.0
    per_minute: int = 10
    retry_s: float = 60.0
    promise_s: float = 120.0
    domains: tuple[str, ...] = (ZONE_LABEL,)
    limits: Limits = field(default_factory=Limits)
    hold_s: float = 120.0


@dataclass(frozen=True, slots=True)
class Victim:
    uid: str
    namespace: str
    name: str
    node: str  # the node whose GPUs it frees
    priority: int

    @property
    def pod(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Preemption:
    """The victims to evict for one preemptor, where, and why (a sentence for Events)."""

    preemptor: Waiting
    node: str
    tier: str  # "own node", "topology.kubernetes.io/zone=a", "any node"
    victims: tuple[Victim, ...]
    hold: Allocation  # the slice on ``node`` once the victims are gone (scratch state)
    deferred: bool = False  # over the per-minute cap: a later round
    written: bool = False  # a re-drive: the hold is in the ledger, its evictions were not sent

    def describe(self) -> str:
        who = ", ".join(f"{v.pod} (priority {v.priority})" for v in self.victims)
        what = self.preemptor.request.describe()
        return (f"evicting {len(self.victims)} pod{'s' if len(self.victims) != 1 else ''} of "
                f"lower priority on node {self.node} ({who}) to make room for the remote GPU "
                f"slice of {self.preemptor.pod} (priority {self.preemptor.priority}, {what}); "
                f"serving tier: {self.tier}")


@dataclass(frozen=True, slots=True)
class RoundPlan:
    preemptions: tuple[Preemption, ...] = ()
    skipped: tuple[Skip, ...] = ()
    next_s: float | None = None  # when to look again (a deferral or a retry ends)


@dataclass
class _Memory:
    promised: dict[str, tuple[Allocation, float]] = field(default_factory=dict)  # uid -> until
    evicted: set[str] = field(default_factory=set)  # victims evicted, not yet seen gone
    retry_at: dict[str, float] = field(default_factory=dict)  # victim uid -> not before
    sent: deque[float] = field(default_factory=deque)  # eviction times, the last minute


class RemotePlanner:
    """Plans round by round and remembers outcomes (one thread)."""

    def __init__(self, config: PreemptionConfig | None = None):
        self.config = config or PreemptionConfig()
        self.placer = Placer(make_policy(POLICY, PolicyConfig()))
        self._m = _Memory()

    def plan(self, observed: Observed, pods: Iterable[Mapping[str, Any]],
             node_labels: Mapping[str, Labels], catalogue: Catalogue | None, now: float,
             views: Mapping[str, View] | None = None) -> RoundPlan:
        """This round's preemptions (``node_labels``: every node's labels, empty when not
        known; ``catalogue``: classes, groups, quotas and permissions, None: none apply;
        ``views``: the GPULedgers as read, their live holds counted)."""
        if not self.config.enabled:
            return RoundPlan()
        by_uid = {remotewaiting.uid_of(p): p for p in pods}
        self._forget(by_uid)
        wanted, skips, due = remotewaiting.waiting(by_uid.values(), now, self.config.grace_s)
        state = preemption_state(observed)
        cands = remotewaiting.candidates(observed.holdings, by_uid, self._m.evicted)
        for c in cands:
            if c.leaving:
                state.release(c.key)  # their room is free for every need
        held = remoteledgers.count(state, remoteledgers.live_holds(
            views or {}, remotewaiting.bound(by_uid.values()), now))
        ready = [c for c in cands if not c.leaving and self._m.retry_at.get(c.key, 0) <= now
                 and c.key not in held.displaced]
        promised = self._hold_promises(state, {w.uid for w in wanted}, now, held)
        room = self._room(now)
        names = {h.key: h.pod for h in observed.holdings}
        out: list[Preemption] = []
        later: list[float] = []
        for w in wanted:
            own = held.of(w.uid)
            found: Preemption | Skip | None
            if own is not None:
                found = self._redrive(w, own, cands, names, now, later)
            elif w.uid in promised:
                continue
            else:
                found = self._one(state, w, ready, node_labels, catalogue, names, held)
            if isinstance(found, Skip):
                skips.append(found)
                continue
            if found is None:
                continue
            if len(found.victims) > room:
                found = replace(found, deferred=True)
            else:
                room -= len(found.victims)
                if not found.written:
                    self.promise(w.uid, found.hold, now)
            out.append(found)
            ready = [c for c in ready if c.key not in {v.uid for v in found.victims}]
        return RoundPlan(tuple(out), tuple(skips), self._next(out, now, due, later))

    def record(self, victim: Victim, evicted: bool, gone: bool, now: float) -> None:
        """What became of an eviction: ``evicted`` (or ``gone``: nothing to evict), else
        refused (tried again after ``retry_s``)."""
        if evicted or gone:
            self._m.evicted.add(victim.uid)
            self._m.retry_at.pop(victim.uid, None)
        else:
            self._m.retry_at[victim.uid] = now + self.config.retry_s
        if not gone:
            self._m.sent.append(now)

    def promise(self, uid: str, alloc: Allocation, now: float) -> None:
        """Keep the room ``alloc`` holds for pod ``uid`` for ``promise_s``."""
        self._m.promised[uid] = (alloc, now + self.config.promise_s)

    def unpromise(self, uid: str) -> None:
        """Forget the room promised to pod ``uid`` (its hold was not written: the pod is
        planned afresh in a later round)."""
        self._m.promised.pop(uid, None)

    # -- one preemptor ---------------------------------------------------------------------
    def _redrive(self, w: Waiting, own: LiveHold, cands: Sequence[Candidate],
                 names: Mapping[str, str], now: float, later: list[float]
                 ) -> Preemption | None:
        """Pod ``w``'s own live hold: its room is held, nothing to plan; once the hold is
        ``REDRIVE_S`` old, the displaced pods that still run (their evictions were never
        sent) are evicted again (``written``)."""
        left = [c for c in remoteledgers.stranded(own, cands)
                if self._m.retry_at.get(c.key, 0) <= now]
        if not left:
            return None
        if not remoteledgers.redrive_due(own, now):
            later.append((own.entry.bind_s or now) + remoteledgers.REDRIVE_S)
            return None
        victims = tuple(_victim(c, own.node, names) for c in left)
        return Preemption(w, own.node, "held", victims, own.entry.allocation, written=True)

    def _one(self, state: ClusterState, w: Waiting, ready: Sequence[Candidate],
             labels: Mapping[str, Labels], catalogue: Catalogue | None,
             names: Mapping[str, str], held: Counted) -> Preemption | Skip | None:
        try:
            c = constraints_for(state, w.request, catalogue) if catalogue is not None \
                else NO_CONSTRAINTS
        except GpupoolError as exc:
            return Skip(w.uid, w.pod, f"its constraints cannot be worked out: {exc}", True)
        if c.blocked is not None:
            return Skip(w.uid, w.pod, f"evicting others would not help: {c.blocked.message}")
        part = replace(slice_of(w.request), key=w.uid)
        if feasible(state, part, c)[0].any():
            self._hold(state, part, c, None)  # room now: kube-scheduler places it
            return None
        if labels and not any(w.admits(n, dict(ls)) for n, ls in labels.items()):
            return Skip(w.uid, w.pod, "evicting others would not help: no node matches its "
                        "nodeSelector and required node affinity, so kube-scheduler can "
                        "place it nowhere")
        why = ""
        for tier, rows in tiers(state, labels, w.admits, self.config.domains):
            rows = [r for r in rows if state.nodes[r].name not in held.claimed]
            if not rows:
                continue
            chosen = select(Room(state, part, c, rows), ready, below(w.priority), {},
                            self.config.limits)
            if isinstance(chosen, NoVictims):
                why = why or chosen.message
                continue
            if chosen.node is None or not chosen.victims:
                continue
            released = [a for a in (state.release(v.key) for v in chosen.victims) if a]
            alloc = self._hold(state, part, c, chosen.node)
            if alloc is None:  # the core's own fit disagrees: undo, try the next tier
                for a in released:
                    state.reserve(a)
                continue
            victims = tuple(_victim(v, chosen.node, names) for v in chosen.victims)
            return Preemption(w, chosen.node, tier, victims, alloc)
        return Skip(w.uid, w.pod, f"no pods of lower priority whose eviction makes room for "
                    f"its slice: {why or 'none on the nodes that could serve it'}"
                    f"{_held_note(held, w.uid)}")

    def _hold(self, state: ClusterState, part: Any, c: Constraints, node: str | None
              ) -> Allocation | None:
        """Place ``part`` (on ``node``, or anywhere) on the scratch state and hold it."""
        among = None if node is None else _rows(state, [node])
        placed = self.placer.decide(state, part, random.Random(0), c, among).allocation
        if placed is None:
            return None
        state.reserve(placed)
        return placed

    def _hold_promises(self, state: ClusterState, pending: set[str], now: float,
                       held: Counted) -> set[str]:
        """Hold again the room promised to pods still pending (unless their hold in the
        ledger holds it already); drop the rest."""
        kept = set()
        for uid, (alloc, until) in list(self._m.promised.items()):
            try:
                if uid not in pending or until <= now:
                    raise GpupoolError("expired")
                if held.of(uid) is None:
                    state.reserve(alloc)
                kept.add(uid)
            except GpupoolError:
                del self._m.promised[uid]
        return kept

    # -- memory ------------------------------------------------------------------------------
    def _forget(self, pods: Mapping[str, Mapping[str, Any]]) -> None:
        self._m.evicted &= set(pods)
        for uid in set(self._m.retry_at) - set(pods):
            del self._m.retry_at[uid]

    def _room(self, now: float) -> int:
        while self._m.sent and now - self._m.sent[0] >= 60.0:
            self._m.sent.popleft()
        return max(self.config.per_minute - len(self._m.sent), 0)

    def _next(self, out: list[Preemption], now: float, due: float | None,
              later: Sequence[float]) -> float | None:
        soon = [t for t in (*self._m.retry_at.values(), due, *later)
                if t is not None and t > now]
        if any(p.deferred for p in out) and self._m.sent:
            soon.append(self._m.sent[0] + 60.0)
        soon += [until for _, until in self._m.promised.values()]
        return min(soon, default=None)


def _held_note(held: Counted, uid: str) -> str:
    """Which other pods' holds took room (said when no victims were found)."""
    others = [h for h in (held.holds or {}).values() if h.uid != uid]
    if not others:
        return ""
    shown = ", ".join(f"{h.pod} on node {h.node}" for h in others[:3])
    more = f" and {len(others) - 3} more" if len(others) > 3 else ""
    return (f"; the room held for other pods by preemptions under way is theirs, and their "
            f"victims are nobody else's ({shown}{more})")


def _victim(c: Candidate, node: str, pods: Mapping[str, str]) -> Victim:
    ns, _, name = pods.get(c.key, c.key).partition("/")
    return Victim(c.key, ns, name, node, c.priority)


def _rows(state: ClusterState, names: Iterable[str]) -> Any:
    return np.array([state.index[n] for n in names if n in state.index], np.int64)


def tiers(state: ClusterState, labels: Mapping[str, Labels],
          admits: Callable[[str, Mapping[str, str]], bool], domains: Sequence[str]
          ) -> list[tuple[str, list[int]]]:
    """The state's GPU nodes (rows) in ``ServingPlacer``'s tiers, as seen from the nodes the
    pod may run on (those ``admits`` by name and labels): those nodes, then each domain
    label's nodes sharing a value with them, then any other; empty tiers left out. Without
    node labels (``labels`` empty) every row is one tier, "any node"."""
    rows = [i for i, n in enumerate(state.nodes) if n.gpus]
    if not labels:
        return [("any node", rows)] if rows else []
    homes = {n for n, ls in labels.items() if admits(n, dict(ls))}
    out: list[tuple[str, list[int]]] = []
    left = list(rows)
    own = [i for i in left if state.nodes[i].name in homes]
    out.append(("own node", own))
    left = [i for i in left if i not in set(own)]
    for label in domains:
        values = {dict(labels[h]).get(label) for h in homes} - {None}
        hit = [i for i in left if dict(labels.get(state.nodes[i].name, ())).get(label) in values]
        shown = next(iter(values)) if len(values) == 1 else "|".join(sorted(map(str, values)))
        out.append((f"{label}={shown}", hit))
        left = [i for i in left if i not in set(hit)]
    out.append(("any node", left))
    return [(name, r) for name, r in out if r]


def preemption_state(observed: Observed) -> ClusterState:
    """The published GPUs with every counted decision held, remote slices included
    (``figures.cluster_state``)."""
    return cluster_state(observed)
