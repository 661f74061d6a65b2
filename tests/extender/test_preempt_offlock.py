"""Preemption plans are made off the cache lock, and count only if they still hold.

The planner is slowed at its one seam (``Preemptor(choose=...)``: the pure chooser of
victims) by waiting on an event the test sets, never by sleeping: while it waits, other
pods are filtered, prioritized and bound; then the plan is checked against what happened
meanwhile. Same cluster as ``test_preemption``: one node of four 80 GiB GPUs, four pods
of low priority holding 60000 MiB each, a pod of high priority asking as much.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.core.victims import NoVictims, Selection
from gpupool.extender.preemption import planner
from gpupool.extender.preemption.preemptor import Preemptor
from tests.waiting import wait_for

from .builders import Replica, pod_obj, schedule
from .test_preemption import (
    FAST,
    MIB,
    Clock,
    clock,
    evictions,
    fill,
    filtered,
    high,
    ledger_entries,
    node,
    replica,
    settled,
    start,
    with_priority,
)

__all__ = ["clock", "node", "replica"]  # fixtures, shared with test_preemption
WAIT_S = 60.0  # only a broken extender waits this long: every wait below ends at once


class Gate:
    """A planner that tells when it is choosing and waits to be let go."""

    def __init__(self) -> None:
        self.choosing = threading.Event()
        self.go = threading.Event()
        self.asks: list[planner.Ask] = []

    def __call__(self, ask: planner.Ask) -> Selection | NoVictims:
        self.asks.append(ask)
        self.choosing.set()
        self.go.wait(WAIT_S)
        return planner.choose(ask)


def with_planner(r: Replica, clock: Clock, choose: Callable[[planner.Ask],
                                                             Selection | NoVictims]) -> Preemptor:
    """The replica's preemptor, made again with ``choose`` as its planner."""
    old = r.extender.preemptor
    assert old is not None
    old.close()
    ext = r.extender
    new = Preemptor(r.cache, r.api, ext.metrics, FAST, clock, ext._decide_on_row, choose)
    ext.preemptor = new
    return new


def uid(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["uid"])


def test_other_pods_are_filtered_and_bound_while_a_plan_is_being_made(
        fake: FakeApiServer, replica: Replica, node: str, clock: Clock) -> None:
    fill(fake, replica, node, [1, 2, 3, 4])
    gate = Gate()
    preemptor = with_planner(replica, clock, gate)
    pod = high(fake, replica)
    filtered(replica, pod, node)
    assert gate.choosing.wait(WAIT_S)
    small = fake.seed("pods", pod_obj("small", {"gpupool.io/gpu-memory": "10000"}))
    assert wait_for(lambda: uid(small) in replica.cache.unbound)
    # the planner is still choosing (it holds no lock): filter, prioritize and bind answer
    assert schedule(replica.extender, small, [node]) == (node, "")
    assert "have room" in filtered(replica, pod, node)["FailedNodes"][node]
    assert preemptor.planning == {uid(pod)} and evictions(fake) == []
    gate.go.set()
    assert settled(replica)
    assert len(gate.asks) == 1 and len(evictions(fake)) == 1
    assert fake.get("pods", "low0", "default") is None  # the lowest priority made the room
    hold = ledger_entries(fake, node)[uid(pod)]
    assert hold["kind"] == "hold" and len(hold["displaces"]) == 1


def test_a_bind_that_takes_the_room_while_the_plan_is_made_makes_it_plan_again(
        fake: FakeApiServer, replica: Replica, node: str, clock: Clock) -> None:
    fill(fake, replica, node, [1, 2, 3])
    going = fake.seed("pods", with_priority(pod_obj("going", MIB), 5))
    assert wait_for(lambda: uid(going) in replica.cache.unbound)
    assert schedule(replica.extender, going, [node]) == (node, "")
    fake.patch("pods", "going", {"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}},
               "default")
    assert wait_for(lambda: replica.cache.pods[uid(going)].leaving)
    gate = Gate()
    preemptor = with_planner(replica, clock, gate)
    pod = high(fake, replica)
    filtered(replica, pod, node)
    assert gate.choosing.wait(WAIT_S)  # it will count on the leaving pod's room: nobody goes
    fake.delete("pods", "going", "default")
    assert wait_for(lambda: uid(going) not in replica.cache.pods)
    rival = high(fake, replica, "rival", priority=0)  # takes that room before the commit
    assert schedule(replica.extender, rival, [node]) == (node, "")
    assert wait_for(lambda: getattr(replica.cache.pods.get(uid(rival)), "decision", None))
    gate.go.set()
    assert settled(replica)
    assert len(gate.asks) == 2  # the first plan went stale; the second saw the rival
    assert replica.extender.metrics.stale_plans.labels("replanned")._value.get() == 1
    assert len(evictions(fake)) == 1 and fake.get("pods", "rival", "default") is None
    hold = ledger_entries(fake, node)[uid(pod)]
    assert hold["kind"] == "hold" and hold["displaces"] == [uid(rival)]
    assert preemptor.inflight == {}


def test_a_hold_another_replica_writes_while_the_plan_is_made_makes_it_plan_again(
        fake: FakeApiServer, replica: Replica, node: str, clock: Clock) -> None:
    low = fill(fake, replica, node, [1, 2, 3, 4])
    other = start(fake, clock)
    try:
        gate = Gate()
        with_planner(replica, clock, gate)
        pod, rival = high(fake, replica, "urgent"), high(fake, replica, "urgent-too")
        assert wait_for(lambda: uid(rival) in other.cache.unbound)
        filtered(replica, pod, node)
        assert gate.choosing.wait(WAIT_S)  # it will choose low0, the lowest priority
        filtered(other, rival, node)  # the other replica holds low0's room and evicts it
        assert settled(other) and len(evictions(fake)) == 1
        assert wait_for(lambda: replica.cache.live_hold(uid(rival)) is not None)
        gate.go.set()
        assert settled(replica)
        assert len(gate.asks) == 2
        assert replica.extender.metrics.stale_plans.labels("replanned")._value.get() == 1
        assert len(evictions(fake)) == 2  # low0 once, for the rival; low1 for this pod
        assert [fake.get("pods", p["metadata"]["name"], "default") is None for p in low] == \
            [True, True, False, False]
        holds = ledger_entries(fake, node)
        assert holds[uid(rival)]["displaces"] == [uid(low[0])]
        assert holds[uid(pod)]["displaces"] == [uid(low[1])]
    finally:
        other.close()


def test_a_pod_deleted_while_its_plan_is_made_evicts_nobody(
        fake: FakeApiServer, replica: Replica, node: str, clock: Clock) -> None:
    fill(fake, replica, node, [1, 2, 3, 4])
    gate = Gate()
    with_planner(replica, clock, gate)
    pod = high(fake, replica)
    filtered(replica, pod, node)
    assert gate.choosing.wait(WAIT_S)
    fake.delete("pods", "urgent", "default")
    assert wait_for(lambda: uid(pod) in replica.cache.finished)
    gate.go.set()
    assert settled(replica)
    assert evictions(fake) == [] and uid(pod) not in ledger_entries(fake, node)
    assert len(gate.asks) == 1  # nothing to plan again for: the pod is gone
    assert replica.extender.metrics.stale_plans.labels("dropped")._value.get() == 1


def test_a_victim_that_gained_priority_is_not_evicted(
        fake: FakeApiServer, replica: Replica, node: str, clock: Clock) -> None:
    fill(fake, replica, node, [1, 2, 3, 4])
    gate = Gate()
    preemptor = with_planner(replica, clock, gate)
    pod = high(fake, replica, priority=3)  # may preempt low0 and low1 only
    filtered(replica, pod, node)
    assert gate.choosing.wait(WAIT_S)
    ask = gate.asks[0]
    chosen = planner.choose(ask)
    assert isinstance(chosen, Selection) and chosen.keys == (_uid_of(replica, "low0"),)
    with replica.cache.lock:  # what recheck sees if low0 came back with a higher priority
        f = replica.cache.pods[chosen.keys[0]]
        replica.cache.pods[f.uid] = _replace(f, priority=50)
        why = planner.recheck(replica.cache, preemptor.decide, ask, chosen)
        replica.cache.pods[f.uid] = f
    assert why == "pod default/low0 is no longer of lower priority"
    gate.go.set()
    assert settled(replica) and len(evictions(fake)) == 1


def _uid_of(r: Replica, name: str) -> str:
    return next(u for u, f in r.cache.pods.items() if f.name == name)


def _replace(f: Any, **changes: Any) -> Any:
    import dataclasses
    return dataclasses.replace(f, **changes)


def test_a_filter_after_the_preemptor_closed_answers_and_plans_nothing(
        fake: FakeApiServer, replica: Replica, node: str, clock: Clock) -> None:
    fill(fake, replica, node, [1, 2, 3, 4])
    preemptor = replica.extender.preemptor
    assert preemptor is not None
    preemptor.close()  # the extender is stopping; kube-scheduler may still call once more
    pod = high(fake, replica)
    assert "have room" in filtered(replica, pod, node)["FailedNodes"][node]
    assert preemptor.planning == set() and evictions(fake) == []
