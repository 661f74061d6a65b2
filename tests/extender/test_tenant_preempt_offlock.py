"""Preemption inside a tenant's quota is planned off the cache lock, and counts only if
the quota is still short by the same need and its victims are unchanged.

The planner is slowed at its one seam (``Preemptor(choose=...)``) by waiting on an event
the test sets, never by sleeping. Same cluster as ``test_tenant_preemption``: two nodes
of four GPUs (room is never what is short), tenant team-a allowed 2 GPUs, holding them
with a pod of priority 10 and one of 50; a pod of team-a of priority 100 is refused by
the quota.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.extender.preemption import planner, tenantpreempt
from gpupool.extender.preemption.preemptor import Preemptor
from tests.waiting import wait_for

from .builders import Replica, pod_obj, schedule
from .test_preempt_offlock import WAIT_S, Gate, uid
from .test_preemption import evictions
from .test_tenant_preemption import (
    FAST,
    ONE,
    alive,
    nodes,
    pending,
    quota,
    run,
    samples,
    settled,
)

__all__ = ["nodes"]  # a fixture, shared with test_tenant_preemption


@pytest.fixture
def gated(fake: FakeApiServer, nodes: list[str]) -> Iterator[tuple[Replica, Gate]]:
    """A replica whose planner waits for the test's go."""
    r = Replica(fake, preemption=FAST)
    assert wait_for(lambda: "budgets" in r.cache.synced)
    old, ext, gate = r.extender.preemptor, r.extender, Gate()
    assert old is not None
    old.close()
    ext.preemptor = Preemptor(r.cache, r.api, ext.metrics, FAST, old.clock,
                              ext._decide_on_row, gate)
    yield r, gate
    r.close()


def team(fake: FakeApiServer, r: Replica, nodes: list[str]
         ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """team-a's quota full with low (10) and mid (50); urgent (100) refused by it."""
    quota(fake, r, "team-a", ["a"], 2)
    low = run(fake, r, nodes, "low", "a", priority=10)
    mid = run(fake, r, nodes, "mid", "a", priority=50)
    return low, mid, pending(fake, r, "urgent", "a", 100)


def stale(r: Replica, then: str) -> float:
    return float(r.extender.metrics.stale_plans.labels(then)._value.get())


def test_another_pod_is_filtered_and_bound_while_a_quota_plan_is_being_made(
        fake: FakeApiServer, gated: tuple[Replica, Gate], nodes: list[str]) -> None:
    r, gate = gated
    low, mid, urgent = team(fake, r, nodes)
    answer = r.extender.filter({"Pod": urgent, "NodeNames": nodes})
    assert all("quota of tenant team-a exceeded" in v for v in answer["FailedNodes"].values())
    assert gate.choosing.wait(WAIT_S)
    assert gate.asks[0].needs is not None  # planned as a quota's, on the planner thread
    other = fake.seed("pods", pod_obj("other", ONE, ns="b"))
    assert wait_for(lambda: uid(other) in r.cache.unbound)
    # the planner is still choosing (it holds no lock): filter, prioritize and bind answer
    assert schedule(r.extender, other, nodes)[1] == ""
    preemptor = r.extender.preemptor
    assert preemptor is not None and preemptor.planning == {uid(urgent)}
    assert evictions(fake) == []
    gate.go.set()
    assert settled(r)
    assert len(gate.asks) == 1 and len(evictions(fake)) == 1
    assert not alive(fake, low) and alive(fake, mid) and alive(fake, other)
    assert samples(r, "gpupool_extender_tenant_preemptions_total") == {
        ("team-a", "priority"): 1}
    assert wait_for(lambda: uid(low) not in r.cache.pods)
    assert schedule(r.extender, urgent, nodes)[1] == ""


def test_a_quota_freed_while_the_plan_is_made_drops_the_plan_and_evicts_nobody(
        fake: FakeApiServer, gated: tuple[Replica, Gate], nodes: list[str]) -> None:
    r, gate = gated
    low, mid, urgent = team(fake, r, nodes)
    r.extender.filter({"Pod": urgent, "NodeNames": nodes})
    assert gate.choosing.wait(WAIT_S)  # it will choose low, the lowest priority
    fake.delete("pods", "mid", "a")  # the tenant's quota has room for urgent now
    assert wait_for(lambda: uid(mid) not in r.cache.pods)
    gate.go.set()
    assert settled(r)
    assert stale(r, "replanned") == 1  # the quota changed: planned once more...
    assert len(gate.asks) == 2  # ...which finds the quota short of nothing
    assert r.extender.metrics.preemptions.labels("no-victims")._value.get() == 1
    assert evictions(fake) == [] and alive(fake, low)
    assert samples(r, "gpupool_extender_tenant_preemptions_total") == {}
    assert schedule(r.extender, urgent, nodes)[1] == ""  # it fits its quota now


def test_a_quota_victim_that_gained_priority_is_refused_by_the_recheck(
        fake: FakeApiServer, gated: tuple[Replica, Gate], nodes: list[str]) -> None:
    r, gate = gated
    low, _, urgent = team(fake, r, nodes)
    r.extender.filter({"Pod": urgent, "NodeNames": nodes})
    assert gate.choosing.wait(WAIT_S)
    ask = gate.asks[0]
    chosen = tenantpreempt.choose(ask.needs or (), _everyone(ask), ask.state.state(),
                                  ask.budgets.allowed(), ask.want.limits)
    assert isinstance(chosen, tenantpreempt.Chosen)
    assert [c.key for c in chosen.victims] == [uid(low)]
    preemptor = r.extender.preemptor
    assert preemptor is not None
    with r.cache.lock:  # what recheck sees if low came back with a higher priority
        f = r.cache.pods[uid(low)]
        r.cache.pods[f.uid] = _replace(f, priority=60)
        why = planner.recheck(r.cache, preemptor.decide, ask, chosen)
        r.cache.pods[f.uid] = f
    assert why == "pod a/low changed priority"
    gate.go.set()
    assert settled(r) and len(evictions(fake)) == 1 and not alive(fake, low)


def _everyone(ask: planner.Ask) -> list[Any]:
    return planner.candidates(ask, [n.name for n in ask.state.state().nodes])


def _replace(f: Any, **changes: Any) -> Any:
    import dataclasses
    return dataclasses.replace(f, **changes)
