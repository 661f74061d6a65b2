"""Gangs held whole: every member's GPU slices chosen together and held in the GPULedgers
until the members bind, or none (docs/gangs.md; docs/design/extender.md, "Gangs").

When kube-scheduler filters a member of a gang (``state.gangs``) that holds nothing yet,
``GangHolds.consider``

1. **looks** (under the cache lock) at the gang's terms, its members bound already and
   its members the pod informer has as pending, unbound and of gpupool's scheduler (those
   bind could act on: ``gate.assumable``; never a request body). The quorum still to
   place is the gang's minCount less its members bound. A gang that runs already, or
   whose members hold slices for that quorum, leaves this member to be placed as any pod;
   a gang short of members waits, with one reason for all of them;
2. **claims** the gang (``GangClaims``: one Lease per gang in the extender's namespace,
   created, or replaced at the version read once it expired): of two replicas only the one
   whose write wins places the gang; the other tells its member who holds the claim and
   finds the holds in its cache once its ledger watch brings them;
3. **places** it with the core (``core.gang.place_gang``: the packing policy applied to the
   set, quota for the gang as a whole, classes, groups and permissions per member, the
   nodes that serve GPUs through DRA left out as for any pod) on the live state;
4. **charges** it: each member's hold entry goes into the QuotaLedger of every quota
   scope it falls under, the members' charges checked together, by compare-and-swap
   (``quotaholds.GangQuota``); a scope that refuses leaves nothing charged and the gang
   waits whole with the quota's reason;
5. **holds** it: each member's allocation becomes a ``hold`` entry (``expires`` at the
   gang's timeout, ``displaces`` none) in the GPULedger of its node, one write per node
   (``WRITERS`` at once), each in the node's turn and by compare-and-swap against the
   ledger (``LedgerBatches.commit_together``). When a write is lost for good, the holds
   written and the quota charges are removed again and the gang waits whole: it never
   keeps part of its room.

A hold counts in every fit check of every replica (ledger watches) and in the tenants'
quota; filter and prioritize set aside only the member's own (``Commitments.without``), so
no member is ever offered a slice another member holds, and filter passes the member only
on its held node. Bind replaces the hold with the member's decision on the very slices
held (``Binder``). Holds end when their members bind, at the timeout (the entries and the
claim expire), or when the gang can no longer reach its quorum (a member or its PodGroup
deleted): ``sweep``, on the replica that placed it, removes its holds, their quota
charges and its claim.

A gang that finds no room for its quorum may have it made by preemption (``room``, set
by the composition root: ``preemption.gangpreempt``); its claim stays held meanwhile, and
the plan's holds go through ``hold_placed`` (each hold displacing the victims of its node,
whose room the member waits for). ``drop`` lets go of it all when an eviction is refused.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Protocol

from gpupool.contract.gangs import GangRef, GangTerms
from gpupool.contract.tenancy import Broken
from gpupool.core.errors import GpupoolError, OverCommit
from gpupool.core.fit import Constraints
from gpupool.core.gang import Gang, GangPlacement, place_gang
from gpupool.core.model import Node
from gpupool.core.reasons import Check, Reason
from gpupool.core.request import PodRequest, Serving
from gpupool.core.scoring import Policy
from gpupool.core.state import ClusterState
from gpupool.extender.bind.gangclaims import GangClaims, GangSettings
from gpupool.extender.bind.gate import DEFAULT_SCHEDULER, as_json, assumable
from gpupool.extender.bind.ledgerbatch import LedgerBatches
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.state.ledger import HOLD, Entry, Ledgers
from gpupool.extender.tenancy.quotaholds import Charged, GangQuota, Scoped
from gpupool.extender.wire.podspec import may_preempt, pod_priority, pod_request
from gpupool.kube.errors import Conflict, KubeError, NotFound
from gpupool.kube.lease import micro_time

log = logging.getLogger(__name__)

MAX_MEMBERS = 256
"""The most members a gang may ask to place at once: the core places them under the cache
lock (docs/benchmarks.md, "Gangs in the extender"); a bigger gang is refused."""
WRITE_ATTEMPTS = 3
WRITERS = 8  # a gang's ledgers written at once (each node's in its own turn)
REMEMBERED = 4096


@dataclass(frozen=True, slots=True)
class GangAnswer:
    """What filter tells a gang member: the node its slices are held on, or why it waits."""

    gang: str
    node: str = ""
    reason: Reason | None = None

    def why(self) -> Reason:
        """The reason every other node gets."""
        return self.reason or Reason("", Check.GANG, f"{self.gang} holds this member's GPU "
                                     f"slices on node {self.node}", False)


@dataclass(frozen=True, slots=True)
class _Ready:
    """A gang to place now: its reference, the members to place and the state it saw."""

    ref: GangRef
    gang: Gang
    who: dict[str, str]  # member uid -> "namespace/name"
    stamp: tuple[object, ...]


@dataclass(slots=True)
class Owned:
    """A gang this replica placed: its members' nodes, until when it holds them."""

    ref: GangRef
    held: dict[str, str]  # member uid -> node
    expires_s: float
    charged: Charged = field(default_factory=dict)  # QuotaLedgers holding its charges


class RoomMaker(Protocol):
    """What makes room for a gang that does not fit (``preemption.gangpreempt``)."""

    def consider(self, ref: GangRef, gang: Gang, priority: int | None,
                 rules: Mapping[str, Constraints], who: Mapping[str, str], policy: Policy
                 ) -> str:
        """What the members are told of room being made ('' when none is)."""
        ...

    def busy(self, gang: str) -> bool:
        """Whether room is being made for ``gang``."""
        ...


class GangHolds:
    """Places gangs whole and keeps their holds (thread-safe: the cache lock)."""

    def __init__(self, cache: ClusterCache, writes: LedgerBatches, ledgers: Ledgers,
                 claims: GangClaims, settings: GangSettings, clock: Callable[[], float],
                 quota: GangQuota, scheduler: str = DEFAULT_SCHEDULER):
        self.cache, self.writes, self.ledgers, self.claims = cache, writes, ledgers, claims
        self.quota = quota
        self.settings, self.clock, self.scheduler = settings, clock, scheduler
        self.owned: dict[str, Owned] = {}  # gang key -> what this replica holds for it
        self.room: RoomMaker | None = None  # preemption for gangs (the composition root's)
        self.refused: dict[str, tuple[tuple[object, ...], GangAnswer]] = {}
        self.translated: dict[tuple[str, str], PodRequest | None] = {}
        self.writers = ThreadPoolExecutor(WRITERS, thread_name_prefix="extender-gang")

    # -- filter -----------------------------------------------------------------------------
    def consider(self, key: str, policy: Policy, rng: random.Random,
                 said: GangRef | None = None) -> GangAnswer | None:
        """What filter answers pod ``key`` when it is a gang's member; None: place it as any
        pod (no gang, a basic PodGroup, a gang that runs or holds its quorum already).
        ``said``: the gang the request body names; a pod the informer has not shown yet
        that says it is a member waits (it is never placed on its own meanwhile)."""
        if said is None and key not in self.cache.gangs.gang_of:
            return None  # the common case, without the lock
        with self.cache.lock:
            self.cache.flush()
            if said is not None and key not in self.cache.gangs.gang_of and \
                    key not in self.cache.pods:
                return _waiting(said, "this member is not in gpupool's view of the cluster "
                                      "yet")
            look = self._look(key)
        if not isinstance(look, _Ready):
            return look
        holder = self.claims.take(look.ref)
        if holder:
            return _waiting(look.ref, f"its members' GPU slices are being held by {holder}")
        answer = self._place(key, look.ref, policy, rng)
        if answer is None or answer.reason is not None:
            self.let_go(look.ref)
        return answer

    def let_go(self, ref: GangRef) -> None:
        """Release the claim of a gang this replica holds nothing for, unless room is being
        made for it."""
        if not (self.room is not None and self.room.busy(ref.key)):
            self.unclaim(ref)

    def unclaim(self, ref: GangRef) -> None:
        """Release the claim of a gang this replica holds nothing for."""
        if ref.key not in self.owned:
            self.claims.release(ref)

    def _place(self, key: str, ref: GangRef, policy: Policy, rng: random.Random
               ) -> GangAnswer | None:
        with self.cache.lock:
            self.cache.flush()
            look = self._look(key)  # again, now that the claim is ours
            if not isinstance(look, _Ready):
                return look
            rules: dict[str, Constraints] = {}
            placed = place_gang(self.cache.state, look.gang, policy, rng, self.cache.catalogue,
                                rule=lambda s, m: self._rule(rules, s, m))
            if not placed.ok:
                return self._refused(look, placed, rules, policy)
            holding = self._held(placed, look.who, {})
        why = self._charge_and_hold(ref, placed, *holding)
        if why is not None:
            return GangAnswer(ref.key, reason=why)
        held = self.owned[ref.key].held
        return GangAnswer(ref.key, node=held[key]) if key in held else None

    def _rule(self, rules: dict[str, Constraints], state: ClusterState, m: PodRequest
              ) -> Constraints:
        """A member's constraints, remembered for a preemption to use."""
        if m.key not in rules:
            rules[m.key] = self.cache.modes.constraints(state, m, self.cache.catalogue)
        return rules[m.key]

    def _refused(self, look: _Ready, placed: GangPlacement, rules: Mapping[str, Constraints],
                 policy: Policy) -> GangAnswer:
        """The answer to a gang that does not fit (under the lock): its reason, and whether
        room is being made for it by preemption (when room is what it lacks)."""
        reason = placed.reason
        assert reason is not None
        log.info("%s", placed.summary())
        note = self.room.consider(look.ref, look.gang, self._priority(look), rules, look.who,
                                  policy) \
            if self.room is not None and reason.check is Check.GPU_FREE else ""
        if note:
            return GangAnswer(look.ref.key, reason=replace(
                reason, message=f"{reason.message}; {note}", summary=""))
        answer = GangAnswer(look.ref.key, reason=reason)
        self._remember(look.ref.key, look.stamp, answer)
        return answer

    def _priority(self, look: _Ready) -> int | None:
        """The gang's priority (its lowest member's), None when a member may not preempt
        (``spec.preemptionPolicy: Never``; under the lock)."""
        pods = [as_json(self.cache.unbound.get(m.key)) for m in look.gang.members]
        if not all(may_preempt(p) for p in pods):
            return None
        return min(pod_priority(p) for p in pods)

    def hold_placed(self, ref: GangRef, placed: GangPlacement, who: Mapping[str, str],
                    displaces: Mapping[str, tuple[str, ...]]) -> Reason | None:
        """Charge and hold ``placed`` (the members' holds on each node standing for the
        pods ``displaces`` names there); None when done, else why not (nothing stays)."""
        with self.cache.lock:
            if any(a.gpu_node not in self.cache.state.index for a in placed.allocations):
                return _waiting(ref, "a node of its placement is gone").why()
            held = self._held(placed, who, displaces)
        return self._charge_and_hold(ref, placed, *held)

    def _held(self, placed: GangPlacement, who: Mapping[str, str],
              displaces: Mapping[str, tuple[str, ...]]
              ) -> tuple[dict[str, dict[str, Entry]], dict[str, Node], Scoped]:
        """The hold entries by node, the nodes' layouts and the quota scopes to charge
        (under the lock)."""
        state = self.cache.state
        by_node = self._entries(placed, who, displaces)
        nodes = {n: state.nodes[state.index[n]] for n in by_node}
        return by_node, nodes, self.quota.scopes({u: e for entries in by_node.values()
                                                  for u, e in entries.items()})

    def _charge_and_hold(self, ref: GangRef, placed: GangPlacement,
                         by_node: dict[str, dict[str, Entry]], nodes: dict[str, Node],
                         scoped: Scoped) -> Reason | None:
        charged, refused = self.quota.admit(ref.key, scoped)
        if refused:
            return Reason("", Check.QUOTA, refused, False)
        failed = self._hold(by_node, nodes)
        if failed:
            self.quota.release(charged)
            return _waiting(ref, f"its holds could not be written ({failed}); it is placed "
                                 "again at its members' next attempt").why()
        held = {a.key: a.gpu_node for a in placed.allocations}
        self.owned[ref.key] = Owned(ref, held, self.clock() + self.settings.timeout_s, charged)
        log.info("%s; held until %s", placed.summary(), _stamp(self.owned[ref.key].expires_s))
        return None

    def _look(self, key: str) -> GangAnswer | _Ready | None:
        """The gang of pod ``key`` as the cache has it (under the lock): what to answer, or
        the gang to place."""
        cache = self.cache
        ref = cache.gangs.gang_of.get(key)
        if ref is None:
            return None
        held = cache.live_hold(key)
        if held is not None:
            left = sum(1 for v in held[1].displaces if v in cache.pods)
            if left:  # preempted for the gang: its slices are free once they are gone
                return _waiting(ref, f"making room on node {held[0]}: waiting for {left} "
                                     f"preempted pod{'s' if left > 1 else ''} to leave; "
                                     "their GPU slices are held for this member")
            return GangAnswer(ref.key, node=held[0])
        terms = cache.gangs.terms(ref)
        if terms is None:
            return None
        if isinstance(terms, Broken):
            return _waiting(ref, terms.message, prefixed=True)
        return self._members(ref, terms)

    def _members(self, ref: GangRef, terms: GangTerms) -> GangAnswer | _Ready | None:
        cache = self.cache
        uids = cache.gangs.member_uids(ref)
        bound = sum(1 for u in uids if (f := cache.pods.get(u)) is not None and f.node)
        need = terms.min_count - bound
        if need <= 0:
            return None  # the gang runs: one more member is placed as any pod
        pending = [u for u in uids if assumable(cache.unbound.get(u), u, self.scheduler)]
        held = sum(1 for u in pending if cache.live_hold(u) is not None)
        if held >= need:
            return None  # its quorum is held: a member beyond it is placed as any pod
        if held:
            return _waiting(ref, f"{held} of the {need} members it needs hold their GPU "
                                 "slices; the others' holds are on their way")
        if need > MAX_MEMBERS:
            return GangAnswer(ref.key, reason=Reason("", Check.GANG, f"{ref.key}: a quorum of "
                              f"{need} members is more than the {MAX_MEMBERS} gpupool places "
                              "together", True))
        pending = pending[:MAX_MEMBERS]
        requests = [r for u in pending if (r := self._request_of(u)) is not None]
        if len(requests) < need:
            return _waiting(ref, f"{len(requests)} of the {need} members it needs are "
                                 "waiting to be placed")
        if any(r.serving is Serving.REMOTE_REQUIRED for r in requests):
            return GangAnswer(ref.key, reason=Reason("", Check.GANG, f"{ref.key}: a gang's "
                              "members cannot have remote GPU slices", True))
        stamp = (cache.state.layout, cache.state.changes, cache.catalogue_version,
                 tuple(r.key for r in requests), terms)
        remembered = self.refused.get(ref.key)
        if remembered is not None and remembered[0] == stamp:
            return remembered[1]
        gang = Gang(ref.key, tuple(requests), need, terms.together, terms.domain_label)
        who = {u: f"{f.namespace}/{f.name}" for u in pending if (f := cache.pods.get(u))}
        return _Ready(ref, gang, who, stamp)

    def _request_of(self, uid: str) -> PodRequest | None:
        """The request of pending member ``uid`` from the informer's copy (remembered per
        resourceVersion; None when its spec cannot be read: its own filter says why)."""
        pod = self.cache.unbound.get(uid)
        meta = getattr(pod, "metadata", None)
        memo = (uid, str(getattr(meta, "resourceVersion", "") or ""))
        if memo in self.translated:
            return self.translated[memo]
        try:
            request: PodRequest | None = pod_request(as_json(pod))
            if request is not None and request.serving is Serving.REMOTE_ALLOWED:
                request = replace(request, serving=Serving.LOCAL)  # served by its own node
        except GpupoolError:
            request = None
        if len(self.translated) >= REMEMBERED:
            self.translated.clear()
        self.translated[memo] = request
        return request

    def _remember(self, gang: str, stamp: tuple[object, ...], answer: GangAnswer) -> None:
        if len(self.refused) >= REMEMBERED:
            self.refused.clear()
        self.refused[gang] = (stamp, answer)

    # -- holds ------------------------------------------------------------------------------
    def _entries(self, placed: GangPlacement, who: Mapping[str, str],
                 displaces: Mapping[str, tuple[str, ...]]) -> dict[str, dict[str, Entry]]:
        """The members' hold entries, by node (each standing for the pods ``displaces``
        names on its node: the victims' room stays the gang's until every member binds)."""
        now = self.clock()
        by_node: dict[str, dict[str, Entry]] = {}
        members = {m.key: m for m in placed.gang.members}
        for alloc, charge in zip(placed.allocations, placed.charges, strict=True):
            m, node = members[alloc.key], alloc.gpu_node
            by_node.setdefault(node, {})[alloc.key] = Entry(
                alloc, who.get(alloc.key, alloc.key), _stamp(now), m.tenant, m.gpu_class,
                charge.group, HOLD, _stamp(now + self.settings.timeout_s),
                displaces.get(node, ()))
        return by_node

    def _hold(self, by_node: dict[str, dict[str, Entry]], nodes: dict[str, Node]) -> str:
        """Write the holds, a write per node; '' when all are written, else why not (what
        was written is removed again)."""
        order = sorted(by_node)
        outcomes = list(self.writers.map(lambda n: self._write(n, nodes[n], by_node[n]), order))
        failed = [why for why in outcomes if why]
        if failed:
            for node, why in zip(order, outcomes, strict=True):
                if not why:
                    self._unhold(node, list(by_node[node]))
        return failed[0] if failed else ""

    def _write(self, node: str, layout: Node, entries: dict[str, Entry]) -> str:
        last = ""
        for _ in range(WRITE_ATTEMPTS):
            try:
                self.writes.commit_together(node, layout, entries)
                return ""
            except Conflict as exc:  # the writer read the ledger again: try on that
                last = str(exc)
            except OverCommit as exc:  # the room went meanwhile: the placement is stale
                return f"node {node}: {exc}"
            except KubeError as exc:
                return f"node {node}: {exc}"
        return f"node {node}: {last}"

    def _unhold(self, node: str, uids: Sequence[str]) -> None:
        """Remove the holds of ``uids`` from ``node``'s ledger (a member that bound
        meanwhile keeps its entry: only holds go)."""
        for _ in range(WRITE_ATTEMPTS):
            with self.cache.lock:
                view = self.cache.ledgers.get(node)
            if view is None:
                return
            mine = [u for u in uids if (e := view.entries.get(u)) is not None and e.is_hold]
            if not mine:
                return
            try:
                self.cache.ledger_update(self.ledgers.prune(view, mine))
                return
            except (Conflict, NotFound):
                try:
                    self.cache.ledger_update(self.ledgers.fetch(node))
                except KubeError as exc:
                    log.warning("reading the GPU ledger of %s: %s", node, exc)
                    return
            except KubeError as exc:  # they expire anyway
                log.warning("removing gang holds from the GPU ledger of %s: %s", node, exc)
                return

    def _release(self, owned: Owned) -> None:
        """Remove the holds of ``owned`` that are still holds, and their quota charges."""
        by_node: dict[str, list[str]] = {}
        for uid, node in owned.held.items():
            by_node.setdefault(node, []).append(uid)
        for node, uids in sorted(by_node.items()):
            self._unhold(node, uids)
        self.quota.release(owned.charged)

    def drop(self, ref: GangRef) -> None:
        """Let go of what this replica holds for ``ref`` (its preemption failed): its holds,
        their charges and its claim; the gang waits whole again."""
        owned = self.owned.pop(ref.key, None)
        if owned is not None:
            self._release(owned)
        self.unclaim(ref)

    # -- housekeeping -----------------------------------------------------------------------
    def close(self) -> None:
        self.writers.shutdown(wait=True)

    def sweep(self) -> list[str]:
        """Let go of the gangs this replica placed that are done (every member bound or the
        timeout passed: their claims) or can no longer reach their quorum (a member, or its
        PodGroup, deleted: their holds too). Returns the gangs let go."""
        done = []
        for key, owned in list(self.owned.items()):
            with self.cache.lock:
                self.cache.flush()
                state = self._state_of(owned)
            if state == "holding":
                continue
            if state == "incomplete":
                self._release(owned)
                log.info("%s can no longer reach its quorum: its GPU slices are released",
                         key)
            self.claims.release(owned.ref)
            del self.owned[key]
            done.append(key)
        return done

    def _state_of(self, owned: Owned) -> str:
        """holding | done | incomplete (under the lock)."""
        cache = self.cache
        live = [u for u in owned.held if cache.live_hold(u) is not None]
        if not live or self.clock() >= owned.expires_s:
            return "done"
        terms = cache.gangs.terms(owned.ref)
        members = len(cache.gangs.member_uids(owned.ref))
        if not isinstance(terms, GangTerms) or members < terms.min_count:
            return "incomplete"
        return "holding"

    def holds_for(self, key: str) -> bool:
        """Whether pod ``key`` is a gang member whose slices are held (bind uses them)."""
        with self.cache.lock:
            return key in self.cache.gangs.gang_of and self.cache.live_hold(key) is not None


def _waiting(ref: GangRef, why: str, prefixed: bool = False) -> GangAnswer:
    message = why if prefixed else f"{ref.key}: {why}"
    return GangAnswer(ref.key, reason=Reason("", Check.GANG, message, False))


def _stamp(seconds: float) -> str:
    return micro_time(datetime.fromtimestamp(seconds, UTC))
