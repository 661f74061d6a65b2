"""Crash-consistent binds: the extender killed at every step of a bind (before the ledger
write, between the ledger write and the Binding, after the Binding) leaves no pod that
cannot be bound and no slice held by nobody; after a restart the ledgers are reconciled
with the live pods at once, not after a grace period."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer
from waiting import wait_for

from gpupool.contract.annotations import decode, has_decision
from gpupool.core.model import uniform_node
from gpupool.core.state import ClusterState
from gpupool.extender.bind.reconcile import LedgerReconciler

from .builders import Replica, pod_obj, schedule, seed_cluster

STEPS = ("before the ledger write", "between the ledger write and the Binding",
         "after the Binding")
WHOLE = {"gpupool.io/gpu": "1"}


class Crash(BaseException):
    """The extender process dies here: no handler of the bind path runs (not even a
    rollback), as with ``kill -9``."""


def crash_at(replica: Replica, step: str) -> None:
    """Make ``replica``'s next bind die at ``step`` (once)."""
    api = replica.api
    armed = [True]

    def before(call: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if armed[0]:
                armed[0] = False
                raise Crash(step)
            return call(*args, **kwargs)
        return wrapper

    def after(call: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            result = call(*args, **kwargs)
            if armed[0]:
                armed[0] = False
                raise Crash(step)
            return result
        return wrapper

    if step == STEPS[0]:
        api.create_ledger = before(api.create_ledger)  # type: ignore[method-assign]
        api.patch_ledger = before(api.patch_ledger)  # type: ignore[method-assign]
    elif step == STEPS[1]:
        api.bind_pod = before(api.bind_pod)  # type: ignore[method-assign]
    else:
        api.bind_pod = after(api.bind_pod)  # type: ignore[method-assign]


def bind_to(replica: Replica, pod: dict[str, Any], node: str) -> str:
    meta = pod["metadata"]
    replica.extender.filter({"Pod": pod, "NodeNames": [node]})
    return replica.extender.bind({"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                  "PodUID": meta["uid"], "Node": node})["Error"]


def bound_decisions(fake: FakeApiServer) -> dict[str, Any]:
    """uid -> allocation of every bound pod's recorded decision."""
    return {p["metadata"]["uid"]: decode(p["metadata"]["uid"],
                                         p["metadata"]["annotations"]).allocation
            for p in fake.objects("pods")
            if p["spec"].get("nodeName") and has_decision(p["metadata"].get("annotations"))}


def assert_nothing_leaks(fake: FakeApiServer, replica: Replica, nodes: list[str],
                         gpus: int) -> None:
    """Every pod bound; no GPU over-committed; every ledger entry (after one round of
    reconciliation) is a bound pod's decision on that node; the cache and its
    ``gpupool_gpus_allocated`` hold exactly what the bound pods hold."""
    decisions = bound_decisions(fake)
    assert all(p["spec"].get("nodeName") for p in fake.objects("pods"))
    check = ClusterState([uniform_node(n, 10**9, 10**9, gpus, "A100", 40960) for n in nodes])
    for alloc in decisions.values():
        check.reserve(alloc)  # raises OverCommit on a double booking
    LedgerReconciler(replica.cache, replica.api).run_once()
    for ledger in fake.objects("gpuledgers"):
        for uid, entry in ledger["spec"]["entries"].items():
            assert uid in decisions and decisions[uid].node == ledger["spec"]["node"], \
                f"a leaked ledger entry {uid} on {ledger['spec']['node']}: {entry}"

    def held() -> dict[str, Any]:
        with replica.cache.lock:
            replica.cache.flush()
            return {k: a for k, a in replica.cache.state.allocations.items() if a.slices}
    assert wait_for(lambda: set(held()) == set(decisions))
    assert replica.extender.usage_gpus()[0] == check.usage().allocated_milli / 1000
    assert replica.extender.metrics.registry.get_sample_value("gpupool_gpus_allocated") == \
        check.usage().allocated_milli / 1000


@pytest.mark.parametrize("retried_on", ["the same node", "the other node"])
@pytest.mark.parametrize("step", STEPS)
def test_a_bind_killed_at_any_step_leaves_every_pod_bindable_and_nothing_held_by_nobody(
        step: str, retried_on: str, fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 2, 1)  # two nodes of one GPU: a stranded slice blocks a pod
    first, second = (fake.seed("pods", pod_obj(f"p{k}", WHOLE)) for k in range(2))
    dying = Replica(fake)
    crash_at(dying, step)
    with pytest.raises(Crash):
        bind_to(dying, first, nodes[0])
    dying.close()  # no rollback ran: whatever was written stays
    restarted = Replica(fake)
    try:
        if step != STEPS[2]:  # the first pod is still pending: the scheduler retries it
            retry = nodes[0] if retried_on == "the same node" else nodes[1]
            assert bind_to(restarted, first, retry) == ""
        other = nodes[1] if fake.get("pods", "p0", "default")["spec"]["nodeName"] == \
            nodes[0] else nodes[0]
        assert bind_to(restarted, second, other) == ""
        assert_nothing_leaks(fake, restarted, nodes, 1)
    finally:
        restarted.close()


def test_a_replica_killed_again_and_again_still_binds_every_pod(fake: FakeApiServer) -> None:
    """Twelve pods on 3 nodes × 2 GPUs; the extender is killed at each step in turn, every
    other bind, and restarted; the scheduler retries every pod until it is bound."""
    nodes = seed_cluster(fake, 3, 2)
    pods = [fake.seed("pods", pod_obj(f"p{k}", {"gpupool.io/gpu-memory": "20480",
                                                "gpupool.io/gpu-core": "50"}))
            for k in range(12)]
    steps = itertools.cycle(STEPS)
    replica, binds = Replica(fake), 0
    try:
        for pod in pods:
            for _ in range(6):
                binds += 1
                if binds % 2 == 0:
                    crash_at(replica, next(steps))
                try:
                    _, error = schedule(replica.extender, pod, nodes)
                except Crash:
                    replica.close()
                    replica = Replica(fake)
                    continue
                if fake.get("pods", pod["metadata"]["name"], "default")["spec"].get("nodeName"):
                    break
                assert error, "an unbound pod with no error"
        assert_nothing_leaks(fake, replica, nodes, 2)
    finally:
        replica.close()


def test_after_a_restart_the_entries_of_pods_that_are_gone_are_freed_at_once(
        fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 4, 2)
    first = Replica(fake)
    try:
        for k in range(8):
            assert schedule(first.extender, fake.seed("pods", pod_obj(f"p{k}", WHOLE)),
                            nodes)[1] == ""
    finally:
        first.close()
    for pod in fake.objects("pods"):  # the cluster emptied while no extender ran
        fake.delete("pods", pod["metadata"]["name"], "default")
    second = Replica(fake)  # an hour-long ledger grace would not matter
    try:
        assert second.extender.usage_gpus()[0] == 0
        assert all(schedule(second.extender, fake.seed("pods", pod_obj(f"q{k}", WHOLE)),
                            nodes)[1] == "" for k in range(8))
        assert_nothing_leaks(fake, second, nodes, 2)
    finally:
        second.close()


def test_a_pending_pods_leftover_entry_holds_its_slice_only_for_the_pending_grace(
        fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 1, 1)
    pod = fake.seed("pods", pod_obj("p0", WHOLE))
    now = [time.time()]
    dying = Replica(fake, clock=lambda: now[0])
    crash_at(dying, STEPS[1])
    with pytest.raises(Crash):
        bind_to(dying, pod, nodes[0])
    dying.close()
    restarted = Replica(fake, clock=lambda: now[0])
    restarted.cache.assumptions.expiry_s = 0  # its filter only probes the room: no
    # placement of "other" is handed to a bind
    try:
        other = pod_obj("other", WHOLE)
        other["metadata"]["uid"] = "other"

        def fits() -> bool:
            return restarted.extender.filter({"Pod": other, "NodeNames": nodes}
                                             )["NodeNames"] == nodes
        assert not fits()  # it may be another replica's bind in flight: held
        now[0] += 61  # past the pending grace: a bind in flight would have ended
        restarted.cache.sweep()
        assert fits()
        assert LedgerReconciler(restarted.cache, restarted.api).run_once().pruned == 1
        assert fake.get("gpuledgers", nodes[0])["spec"]["entries"] == {}
        assert bind_to(restarted, pod, nodes[0]) == ""  # and the pod itself still binds
    finally:
        restarted.close()


def test_an_entry_of_a_pod_deleted_while_no_replica_watched_is_checked_with_the_api(
        fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 1, 1)
    pod = fake.seed("pods", pod_obj("p0", WHOLE))
    now = [time.time()]
    replica = Replica(fake, clock=lambda: now[0])
    try:
        crash_at(replica, STEPS[1])
        with pytest.raises(Crash):
            bind_to(replica, pod, nodes[0])
        with replica.cache.lock:  # as if the pod's events never reached this replica
            replica.cache.pods.pop(pod["metadata"]["uid"], None)
        fake.store.delete("pods", "p0", "default")
        now[0] += 11
        done = LedgerReconciler(replica.cache, replica.api).run_once()
        assert done.gone == 1 and done.pruned == 1
        assert replica.extender.usage_gpus()[0] == 0
    finally:
        replica.close()
