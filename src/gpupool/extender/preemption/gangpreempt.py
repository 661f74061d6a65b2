"""Preemption for a gang: room for a whole gang made by evicting pods of lower priority
(docs/gangs.md; docs/design/preemption.md, "Room for a gang").

When the extender places a gang (``bind.gangholds``, the gang's claim held) and the core
finds no room for its quorum, ``GangPreemptor.consider`` (under the cache lock, in a
member's filter) hands the gang to the preemptor's planner thread, if every member may
preempt (``spec.preemptionPolicy`` is not ``Never``), the PodDisruptionBudgets are listed
and the gang did not find nothing or fail within ``retry_s``. The gang's priority is its
lowest member's. Then, as for one pod (``planner``):

1. ``take`` (under the lock): a snapshot of the state, a copy of the pod facts, the pods
   live holds displace, the budgets; each member's constraints are those its placement
   worked out;
2. ``choose`` (no lock): every pod gpupool placed, anywhere, is a candidate, gang members
   with their gang, and the core picks the victims for the whole gang
   (``core.victims_gang.select_gang``: lower priority only, pods outside gangs first, a
   victim gang whole, budgets honoured, nobody when the quorum would still not fit);
3. ``recheck`` (under the lock): every member still pending and holding nothing, the
   layout unchanged; every victim still there with the allocation chosen, not leaving nor
   displaced, of lower priority, within its budgets; every running member of a victim gang
   among the victims; the gang's placement reserves on the live state with the victims and
   the leaving pods gone, within the gang's quota. A stale plan is made once more, then
   left to a member's next filter.

The worker thread carries the plan out: the gang's holds are written as a fitting gang's
are (QuotaLedger charges, then one GPULedger write per node, ``gangholds``), each hold
*displacing* the victims and leaving pods of its node, so the ledger counts their room as
the gang's and no other plan chooses them; then each victim is evicted through the
Eviction API (its UID as precondition) and gets a ``Preempted`` Event, and each member a
``GpupoolPreempting`` one. A refused eviction (a budget's 429, any error) removes the
gang's holds and charges: the gang waits whole again (Warning Events on its members) and
may plan again after ``retry_s``. While the victims leave, the members' filter says so;
then each passes on its held node and binds to its held slices.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpupool.contract.gangs import GangRef
from gpupool.core.errors import InvalidInput, OverCommit, UnknownName
from gpupool.core.fit import Constraints
from gpupool.core.gang import Gang, GangPlacement, reserve_gang
from gpupool.core.gangquota import gang_refusal
from gpupool.core.reasons import Reason
from gpupool.core.scoring import Policy
from gpupool.core.state import StateCopy
from gpupool.core.victims import Candidate, Limits, NoVictims, below
from gpupool.core.victims_gang import GangRoom, GangSelection, select_gang
from gpupool.extender.preemption import planner
from gpupool.extender.preemption.plans import Victim
from gpupool.extender.preemption.preemptor import Preemptor
from gpupool.extender.preemption.tenantpreempt import over_budget, pod_name
from gpupool.extender.state.budgets import Budgets
from gpupool.extender.state.pods import PodFacts
from gpupool.kube.errors import KubeError, NotFound

log = logging.getLogger(__name__)

HoldGang = Callable[[GangRef, GangPlacement, Mapping[str, str], Mapping[str, tuple[str, ...]]],
                    Reason | None]
"""(gang, placement, member uid -> namespace/name, node -> uids its holds displace) ->
None once the gang's holds and charges are written, else why not (nothing stays written)."""
LetGo = Callable[[GangRef], None]
"""Let go of what this replica holds for a gang (``drop``: its holds, charges and claim;
``unclaim``: its claim, unless it holds its slices)."""
NOTE = "room is being made for it by preempting pods of lower priority"


@dataclass(frozen=True, slots=True)
class GangWant:
    """A gang to make room for: its members, priority, constraints and names."""

    ref: GangRef
    gang: Gang
    priority: int
    rules: Mapping[str, Constraints]  # member key -> its constraints on ``layout``
    who: Mapping[str, str]  # member uid -> namespace/name
    policy: Policy
    layout: object

    @property
    def key(self) -> str:
        return self.ref.key


@dataclass(frozen=True, slots=True)
class GangAsk:
    """What one plan is chosen from, taken under the cache lock; nothing in it changes."""

    want: GangWant
    state: StateCopy
    pods: Mapping[str, PodFacts]
    displaced: frozenset[str]
    budgets: Budgets


@dataclass(frozen=True, slots=True)
class GangPlan:
    """Room to make for a gang: where its members go, whom to evict, whom each node's
    holds stand for."""

    want: GangWant
    placement: GangPlacement
    victims: tuple[Victim, ...]
    displaces: Mapping[str, tuple[str, ...]]


class GangPreemptor:
    """Plans on the preemptor's planner thread and carries out on its worker thread."""

    def __init__(self, preemptor: Preemptor, hold: HoldGang, drop: LetGo, unclaim: LetGo):
        self.preemptor, self.cache = preemptor, preemptor.cache
        self.hold, self.drop, self.unclaim = hold, drop, unclaim
        self.planning: set[str] = set()  # gang keys whose plan is being made
        self.inflight: dict[str, GangPlan] = {}
        self.retry_at: dict[str, float] = {}

    def busy(self, gang: str) -> bool:
        """Whether room is being made for ``gang`` (its claim must stay held)."""
        return gang in self.planning or gang in self.inflight

    # -- considering (in a member's filter, under the cache lock) ---------------------------
    def consider(self, ref: GangRef, gang: Gang, priority: int | None,
                 rules: Mapping[str, Constraints], who: Mapping[str, str], policy: Policy
                 ) -> str:
        """What the members are told of room being made ('' when none is); starts a plan
        when it should. ``priority``: the gang's (None: a member may not preempt)."""
        p = self.preemptor
        if self.busy(ref.key):
            return NOTE
        if priority is None or not p.settings.enabled or "budgets" not in self.cache.synced \
                or self.retry_at.get(ref.key, 0.0) > p.clock():
            return ""
        want = GangWant(ref, gang, priority, dict(rules), dict(who), policy,
                        self.cache.state.layout)
        self.planning.add(ref.key)
        try:
            p.planners.submit(self._plan, want)
        except RuntimeError:  # closed: the extender is stopping
            self.planning.discard(ref.key)
            return ""
        return NOTE

    # -- planning (the planner thread) ------------------------------------------------------
    def _plan(self, want: GangWant, first: bool = True) -> None:
        metrics, again = self.preemptor.metrics, False
        try:
            with self.cache.lock:
                self.cache.flush()
                ask = self.take(want)
            if ask is None:
                return
            chosen = choose(ask, self.preemptor.settings.limits)
            with self.cache.lock:
                self.cache.flush()
                if isinstance(chosen, NoVictims):
                    self._none(want, chosen.message)
                    return
                found = self.recheck(ask, chosen)
                if isinstance(found, GangPlan):
                    self.inflight[want.key] = found
                    metrics.preemptions.labels("started").inc()
                    self.preemptor.worker.submit(self.carry_out, found)
                    return
                again = first
                metrics.stale_plans.labels("replanned" if again else "dropped").inc()
                log.info("the preemption plan for %s went stale: %s", want.key, found)
            if again:
                self._plan(want, first=False)
        except Exception:  # the planner must survive anything; the gang plans again later
            log.exception("planning a preemption for %s", want.key)
            with self.cache.lock:
                self._retry_later(want.key)
        finally:
            if first:
                with self.cache.lock:
                    ended = want.key not in self.inflight
                if ended:  # nothing held for it: its claim goes before it counts as idle
                    self.unclaim(want.ref)
                with self.cache.lock:
                    self.planning.discard(want.key)

    def take(self, want: GangWant) -> GangAsk | None:
        """The ask of a gang (under the lock, after ``flush``); None when a member was bound
        or holds room, or the nodes were laid out again since its placement."""
        cache = self.cache
        if cache.state.layout is not want.layout or any(
                not planner.pending(cache, m.key) or cache.live_hold(m.key) is not None
                for m in want.gang.members):
            return None
        budgets = Budgets()
        budgets.by_name = dict(cache.budgets.by_name)
        return GangAsk(want, cache.state.snapshot(), cache.pods.copy(),
                       frozenset(cache.displaced()), budgets)

    def _none(self, want: GangWant, why: str) -> None:
        self._retry_later(want.key)
        self.preemptor.metrics.preemptions.labels("no-victims").inc()
        log.info("no preemption for %s: %s", want.key, why)

    def _retry_later(self, key: str) -> None:
        now = self.preemptor.clock()
        self.retry_at = {k: t for k, t in self.retry_at.items() if t > now}
        self.retry_at[key] = now + self.preemptor.settings.retry_s

    # -- rechecking (under the lock) --------------------------------------------------------
    def recheck(self, ask: GangAsk, chosen: GangSelection) -> GangPlan | str:
        """The plan ``chosen`` makes if it still holds on the live state, else why not."""
        want, cache = ask.want, self.cache
        if cache.state.layout is not want.layout:
            return "the nodes were laid out again"
        for m in want.gang.members:
            if not planner.pending(cache, m.key) or cache.live_hold(m.key) is not None:
                return f"member {pod_name(cache, m.key)} was bound or holds room"
        live = self._live(chosen.victims, want.priority)
        if isinstance(live, str):
            return live
        over = over_budget(live, cache.budgets.allowed())
        if over:
            return f"the disruption budget {over} no longer lets its pods go"
        gone = self._leaving(chosen.placement)
        why = self._fits(chosen.placement, [*live, *gone])
        if why:
            return why
        nodes = {a.gpu_node for a in chosen.placement.allocations}
        displaces = {n: tuple(c.key for c in [*live, *gone] if c.allocation.gpu_node == n)
                     for n in sorted(nodes)}
        victims = tuple(Victim(c.key, cache.pods[c.key].namespace, cache.pods[c.key].name,
                               c.priority) for c in live)
        return GangPlan(want, chosen.placement, victims, displaces)

    def _live(self, chosen: tuple[Candidate, ...], priority: int) -> list[Candidate] | str:
        """The victims as the cache has them now, or why one no longer qualifies (a victim
        gang must go whole: every member it runs now among them)."""
        cache, state = self.cache, self.cache.state
        displaced, out = cache.displaced(), []
        for v in chosen:
            f, name = cache.pods.get(v.key), pod_name(cache, v.key)
            if f is None or f.leaving or f.decision is None or v.key in displaced or \
                    state.allocations.get(v.key) != v.allocation or \
                    "pod" not in cache.sources.get(v.key, ()):
                return f"pod {name} is gone, leaving, moved or displaced"
            if f.priority >= priority:
                return f"pod {name} is no longer of lower priority"
            out.append(Candidate(v.allocation, f.priority, f.charge(),
                                 cache.budgets.covering(f.namespace, f.labels), False,
                                 f.bound_s, v.gang))
        keys = {c.key for c in out}
        for gang in {c.gang for c in out if c.gang}:
            running = [u for u in cache.gangs.members.get(gang, {}) if
                       (f := cache.pods.get(u)) is not None and f.node and not f.leaving]
            if not set(running) <= keys:
                return f"{gang} runs members that are not among the victims"
        return out

    def _leaving(self, placement: GangPlacement) -> list[Candidate]:
        """The leaving pods on the placement's nodes (their room counts as free)."""
        state, out = self.cache.state, []
        for node in sorted({a.gpu_node for a in placement.allocations}):
            for alloc in state.allocations_on(node):
                f = self.cache.pods.get(alloc.key)
                if f is not None and f.leaving and alloc.gpu_node == node:
                    out.append(Candidate(alloc, f.priority, leaving=True))
        return out

    def _fits(self, placement: GangPlacement, gone: list[Candidate]) -> str:
        """'' when ``placement`` reserves on the live state with ``gone`` released and fits
        the gang's quota (both undone after), else why not."""
        state = self.cache.state
        released = [a for a in (state.release(c.key) for c in gone) if a is not None]
        try:
            reserve_gang(state, placement)
        except (OverCommit, InvalidInput, UnknownName) as exc:
            return f"its place no longer fits once the victims are gone ({exc})"
        else:
            for alloc in placement.allocations:
                state.release(alloc.key)
        finally:
            for alloc in released:
                state.reserve(alloc)
        refusal = gang_refusal(placement.gang.name, placement.charges, self.cache.catalogue)
        return refusal.message if refusal is not None else ""

    # -- carrying out (the worker thread) ---------------------------------------------------
    def carry_out(self, plan: GangPlan) -> None:
        want = plan.want
        try:
            why = self._stale(plan)
            if not why:
                refused = self.hold(want.ref, plan.placement, want.who, plan.displaces)
                why = refused.message if refused is not None else ""
            if why:
                self._give_up(plan, "abandoned", why, held=False)
                return
            self._evict(plan)
        except Exception:  # the worker must survive anything; the gang plans again later
            log.exception("preempting for %s", want.key)
            self._give_up(plan, "failed", "an internal error", held=True)
        finally:
            with self.cache.lock:
                self.inflight.pop(want.key, None)

    def _stale(self, plan: GangPlan) -> str:
        """Why the plan no longer holds before its holds are written ('' when it does)."""
        with self.cache.lock:
            self.cache.flush()
            displaced = self.cache.displaced()
            for v in plan.victims:
                if v.uid in displaced:
                    return f"pod {v.namespace}/{v.name} is being preempted for another pod"
                if v.uid not in self.cache.pods or v.uid in self.cache.finished:
                    return f"pod {v.namespace}/{v.name} is gone"
        return ""

    def _evict(self, plan: GangPlan) -> None:
        p, want = self.preemptor, plan.want
        for v in plan.victims:
            try:
                p.kube.evict_pod_of(v.namespace, v.name, v.uid)
            except NotFound:
                continue  # gone already
            except KubeError as exc:
                self._give_up(plan, "refused", f"evicting {v.namespace}/{v.name}: {exc}",
                              held=True)
                return
            p.metrics.preempted.inc()
            p.event(v.namespace, v.name, v.uid, "Preempted", False,
                    f"Preempted by gang {want.key} (priority {want.priority}): gpupool frees "
                    "its GPU slices for a gang of higher priority")
        p.metrics.preemptions.labels("held").inc()
        names = ", ".join(v.describe() for v in plan.victims) or "none (pods already leaving)"
        self._tell(plan, "GpupoolPreempting", False,
                   f"making room for gang {want.key}: evicted {names}; the freed GPU slices "
                   "are held for its members")
        log.info("preempting for %s: %s", want.key, names)

    def _give_up(self, plan: GangPlan, outcome: str, why: str, held: bool) -> None:
        p, want = self.preemptor, plan.want
        p.metrics.preemptions.labels(outcome).inc()
        if held:
            self.drop(want.ref)  # its holds and charges go: the gang waits whole
        else:
            self.unclaim(want.ref)
        with self.cache.lock:
            self._retry_later(want.key)
        log.info("preemption for %s %s: %s", want.key, outcome, why)
        if outcome != "abandoned":
            self._tell(plan, "GpupoolPreemptionFailed", True,
                       f"could not make room for gang {want.key}: {why}; gpupool tries again "
                       f"in {p.settings.retry_s:.0f}s")

    def _tell(self, plan: GangPlan, reason: str, warning: bool, message: str) -> None:
        """An Event on each member placed."""
        for alloc in plan.placement.allocations:
            ns, _, name = plan.want.who.get(alloc.key, "/").partition("/")
            if name:
                self.preemptor.event(ns, name, alloc.key, reason, warning, message)


def choose(ask: GangAsk, limits: Limits) -> GangSelection | NoVictims:
    """The victims for the whole gang, from the ask alone (pure): every placed pod in the
    cluster a candidate, gang members with their gang (``victims_gang.select_gang``)."""
    want = ask.want
    state = ask.state.state()
    cands = planner.placed(state, ask.pods, ask.displaced, ask.budgets,
                           [n.name for n in state.nodes], {m.key for m in want.gang.members},
                           gangs=True)
    need = GangRoom(state, want.gang, want.policy, random.Random(0), None,
                    lambda s, m: want.rules[m.key])
    return select_gang(need, cands, below(want.priority), ask.budgets.allowed(), limits)
