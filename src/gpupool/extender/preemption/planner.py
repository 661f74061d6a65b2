"""Planning a preemption apart from the cache lock, and checking the plan again before it
counts.

Choosing victims is the slow part of a preemption (tens to hundreds of milliseconds on
thousands of nodes, ``bench/bench_preemption.py``); every other call of the extender
waits for the cache lock, so the choice is made without it, in three steps:

1. ``take`` (under the lock, cheap: whole copies, no Python code per pod): the ``Ask`` of
   a ``Want`` (the pod's request, priority, sent nodes and the constraints filter worked
   out, which filter hands over) — a snapshot of the state (``ClusterState.snapshot``), a
   copy of the cache's pod facts, the pods live holds displace, the PodDisruptionBudgets.
   It is taken when the planner thread gets to the pod, so that waiting pods hold no
   copies.
2. ``choose`` (no lock, pure): the core's chooser (``core.victims.select`` with ``Room``)
   over the ask alone. Nothing it reads changes while it runs.
3. ``recheck`` (under the lock again, cheap): the plan counts only if it still holds on
   the state as it is now: the pod is still pending and holds no room yet; every victim is
   still there, on that node, holding the very allocation chosen, of lower priority, not
   displaced by another hold, and within its disruption budgets; the pod still fits no
   sent node without preemption; and the placement policy still finds the pod a place on
   that node once the victims and the pods leaving it are gone (the core's own fit, on the
   live state: whatever a bind or another hold took meanwhile is counted), on the layout
   filter worked the constraints out on. Otherwise it
   says why (a sentence), and the preemptor plans once more or leaves it to the pod's
   next filter.

A plan inside a tenant's quota takes the same steps (``Want.quota``): ``take`` also takes
the quotas' needs (``tenantpreempt.needs``), ``choose`` picks the quota's victims among
every placed pod (``tenantpreempt.choose``), ``recheck`` checks them and finds the room
(``tenantpreempt.recheck``).

Whether two plans make one room twice is not decided here: the hold is written with a
compare-and-swap on the node's GPULedger, checked to fit with its victims counted out
(``preemptor``), so the second of two plans for one room never evicts anybody.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from gpupool.core.allocation import Allocation
from gpupool.core.fit import Constraints, feasible_rows
from gpupool.core.request import PodRequest
from gpupool.core.state import ClusterState, StateCopy
from gpupool.core.victims import Candidate, Limits, NoVictims, Room, Selection, below, select
from gpupool.extender.preemption import tenantpreempt
from gpupool.extender.preemption.plans import Plan
from gpupool.extender.state.budgets import Budgets
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.state.pods import PodFacts
from gpupool.extender.wire.podspec import pod_id, pod_priority

Decide = Callable[[PodRequest, Constraints, int], Allocation | None]
"""(request, constraints, state row) -> the pod's allocation on that node now, or None."""


@dataclass(frozen=True, slots=True)
class Want:
    """A pod to plan for: its request, name and priority, the nodes kube-scheduler sent (in
    its order), and the constraints filter worked out on the state's ``layout`` (computing
    them again would note the pod as waiting for fair share once more)."""

    request: PodRequest
    namespace: str
    name: str
    priority: int
    sent: tuple[str, ...]
    constraints: Constraints
    layout: object
    limits: Limits
    quota: bool = False  # refused by a tenant quota its own pods could satisfy

    @property
    def key(self) -> str:
        return self.request.key


def want_of(pod: Mapping[str, Any], request: PodRequest, constraints: Constraints,
            state: ClusterState, rows: Sequence[int], limits: Limits, quota: bool = False
            ) -> Want:
    """The want of a pod filter found no node for among ``rows`` of ``state`` (``quota``:
    a tenant quota refused it, which its own pods going would satisfy)."""
    ident = pod_id(pod)
    return Want(request, ident.namespace, ident.name, pod_priority(pod),
                tuple(state.nodes[i].name for i in rows), constraints, state.layout, limits,
                quota)


@dataclass(frozen=True, slots=True)
class Ask:
    """What one plan is made from, taken under the cache lock; nothing in it changes."""

    want: Want
    sent: tuple[str, ...]  # the sent nodes the state has, in kube-scheduler's order
    rows: tuple[int, ...]  # their rows in ``state``
    state: StateCopy  # a snapshot
    pods: Mapping[str, PodFacts]  # a copy of the cache's
    displaced: frozenset[str]  # pods live holds displace
    budgets: Budgets  # a copy
    needs: tenantpreempt.Needs | None = None  # a quota's (``tenantpreempt.needs``)

    @property
    def key(self) -> str:
        return self.want.key


Choose = Callable[[Ask], "Selection | tenantpreempt.Chosen | NoVictims"]
"""The planner: the victims an ask calls for (pure; ``choose`` unless a test slows it)."""


def pending(cache: ClusterCache, key: str) -> bool:
    """Whether pod ``key`` is still to be placed (under the cache lock)."""
    f = cache.pods.get(key)
    return key not in cache.finished and not (f is not None and f.node)


def take(cache: ClusterCache, want: Want) -> Ask | NoVictims | None:
    """The ask of a pod, on the state as it is now (under the cache lock, after
    ``flush``); None when the pod is no longer pending, no sent node is left or the nodes
    were laid out again since filter (its constraints are of that layout). Whole
    copies: no Python code runs per pod while the lock is held (``candidates`` sorts the
    pods out after). A quota's want also takes what each quota is short of
    (``tenantpreempt.needs``, values; NoVictims when nothing can be)."""
    state = cache.state
    sent = tuple(n for n in want.sent if n in state.index)
    if not sent or not pending(cache, want.key) or state.layout is not want.layout:
        return None
    budgets = Budgets()
    budgets.by_name = dict(cache.budgets.by_name)
    with cache.without(want.key):  # the pod's own leftover hold is no one's room
        wanted = tenantpreempt.needs(cache, want.request, want.priority) \
            if want.quota else None
        if isinstance(wanted, NoVictims):
            return wanted
        return Ask(want, sent, tuple(state.index[n] for n in sent), state.snapshot(),
                   cache.pods.copy(), frozenset(cache.displaced()), budgets, wanted)


def candidates(ask: Ask, nodes: Sequence[str] | None = None) -> list[Candidate]:
    """The pods gpupool placed on the sent nodes (or ``nodes``) as the core's candidates,
    other than the pod itself and gang members (a single pod never evicts a gang:
    docs/gangs.md): ``placed`` over the ask."""
    return placed(ask.state.state(), ask.pods, ask.displaced, ask.budgets,
                  ask.sent if nodes is None else nodes, {ask.key})


def placed(state: ClusterState, pods: Mapping[str, PodFacts], displaced: Collection[str],
           budgets: Budgets, nodes: Sequence[str], skip: Collection[str],
           gangs: bool = False) -> list[Candidate]:
    """The pods gpupool placed on ``nodes`` — their own, or remote slices those nodes serve
    to pods bound elsewhere — whose decisions ``state`` holds, not ``displaced`` by a live
    hold nor in ``skip``, as the core's candidates (gang members with their gang, only when
    ``gangs``): node by node in that order, each node's by UID (the order ``select`` breaks
    its last ties in), each pod once."""
    out: dict[str, Candidate] = {}
    for node in nodes:
        for alloc in sorted(state.allocations_on(node), key=lambda a: a.key):
            f = pods.get(alloc.key)
            if f is None or f.decision is None or f.node != alloc.node or \
                    alloc.key in displaced or alloc.key in skip or alloc.key in out or \
                    not _same(alloc, f.decision) or (f.gang is not None and not gangs):
                continue
            out[alloc.key] = Candidate(alloc, f.priority, f.charge(),
                                       budgets.covering(f.namespace, f.labels), f.leaving,
                                       f.bound_s, f.gang.key if f.gang is not None else "")
    return list(out.values())


def _same(held: Allocation, decision: Allocation) -> bool:
    """Whether the state holds the pod's decision (not a ledger entry's or a bind's other
    allocation under its UID): equal, GPU positions aside (they may be looked up again)."""
    if held == decision:
        return True
    return held.node == decision.node and _slices(held) == _slices(decision)


def _slices(alloc: Allocation) -> list[tuple[str, int, int, str]]:
    return [(s.gpu_uuid, s.memory_mib, s.core_pct, s.container) for s in alloc.slices]


def choose(ask: Ask) -> Selection | tenantpreempt.Chosen | NoVictims:
    """The fewest pods of lower priority whose eviction makes room for the pod on one sent
    node (``core.victims.select``), from the ask alone; for a quota's ask, the pods, anywhere
    in the cluster, that give back what its quotas are short of (``tenantpreempt.choose``:
    ``victims.Quota`` or ``cohort.reclaim``)."""
    w = ask.want
    if ask.needs is not None:
        state = ask.state.state()
        return tenantpreempt.choose(ask.needs, candidates(ask, [n.name for n in state.nodes]),
                                    state, ask.budgets.allowed(), w.limits)
    return select(Room(ask.state.state(), w.request, w.constraints, ask.rows),
                  candidates(ask), below(w.priority), ask.budgets.allowed(), w.limits)


def placed_on(cache: ClusterCache, key: str, rows: Sequence[int]) -> list[Candidate]:
    """The pods gpupool placed on ``rows`` (or whose remote slices they serve) and holds,
    not displaced by another hold nor gang members, as candidates, on the live state
    (under the cache lock)."""
    state = cache.state
    displaced = cache.displaced()
    out = []
    for i in rows:
        for alloc in sorted(state.allocations_on(state.nodes[i].name), key=lambda a: a.key):
            uid = alloc.key  # its own pods, and the remote slices it serves
            f = cache.pods.get(uid)
            if f is None or f.decision is None or uid in displaced or \
                    uid == key or "pod" not in cache.sources.get(uid, ()) or f.gang is not None:
                continue
            out.append(Candidate(alloc, f.priority, f.charge(),
                                 cache.budgets.covering(f.namespace, f.labels), f.leaving,
                                 f.bound_s))
    return out


def hold_on(cache: ClusterCache, decide: Decide, request: PodRequest, constraints: Constraints,
            node: str, chosen: Selection, candidates: Sequence[Candidate]
            ) -> Allocation | None:
    """What the pod would hold on ``node`` with the victims and leaving pods gone (they
    are released for the decision and held again; under the cache lock)."""
    state = cache.state
    gone = [c.allocation for c in (*chosen.victims, *candidates)
            if node in (c.allocation.node, c.allocation.gpu_node) and
            (c.leaving or c in chosen.victims)]
    released = [a for a in (state.release(a.key) for a in dict.fromkeys(gone)) if a]
    try:
        return decide(request, constraints, state.index[node])
    finally:
        for alloc in released:
            state.reserve(alloc)


def recheck(cache: ClusterCache, decide: Decide, ask: Ask,
            chosen: Selection | tenantpreempt.Chosen) -> Plan | str:
    """The plan ``chosen`` makes for ``ask`` if it still holds on the live state, else why
    not (under the cache lock, after ``flush``; see the module, and
    ``tenantpreempt.recheck`` for a quota's)."""
    key, state = ask.key, cache.state
    if not pending(cache, key):
        return "the pod is gone or bound"
    if state.layout is not ask.want.layout:
        return "the nodes were laid out again"
    held = cache.live_hold(key)
    if held is not None:
        return f"room is being made for it on {held[0]} already"
    if isinstance(chosen, tenantpreempt.Chosen):
        if ask.needs is None:
            return "a quota's victims for a plan that is not a quota's"
        with cache.without(key):
            return tenantpreempt.recheck(cache, ask.needs, ask.want, chosen,
                                         partial(placed_on, cache),
                                         partial(hold_on, cache, decide))
    node = chosen.node or ""
    row = state.index.get(node)
    if row is None:
        return f"node {node} is gone"
    here = {c.key: c for c in placed_on(cache, key, [row])}
    for v in chosen.victims:
        c, pod = here.get(v.key), tenantpreempt.pod_name(cache, v.key)
        if c is None or c.allocation != v.allocation or c.leaving:
            return f"pod {pod} is gone, leaving, moved or displaced"
        if c.priority >= ask.want.priority:
            return f"pod {pod} is no longer of lower priority"
    over = tenantpreempt.over_budget([here[v.key] for v in chosen.victims],
                                     cache.budgets.allowed())
    if over:
        return f"the disruption budget {over} no longer lets its pods go"
    with cache.without(key):
        return _placed(cache, decide, ask, replace(chosen, victims=tuple(
            here[v.key] for v in chosen.victims)), list(here.values()))


def _placed(cache: ClusterCache, decide: Decide, ask: Ask, chosen: Selection,
            here: list[Candidate]) -> Plan | str:
    """The plan, once the pod's place on the node is decided again on the live state."""
    w, state, node = ask.want, cache.state, chosen.node or ""
    request = w.request
    c = w.constraints
    rows = np.array([state.index[n] for n in ask.sent if n in state.index], np.int64)
    if rows.size and bool(feasible_rows(state, request, c, rows)[0].any()):
        return "it fits a sent node without preemption now"
    hold = hold_on(cache, decide, request, c, node, chosen, here)
    if hold is None:
        return f"the policy finds no place on {node} once the victims are gone"
    victims = tuple(tenantpreempt.victim_of(cache, v.key, v.priority)
                    for v in chosen.victims)
    leaving = tuple(x.key for x in here if x.leaving)
    return Plan(w.key, w.namespace, w.name, w.priority, node, hold, victims, leaving, request,
                c.group)
