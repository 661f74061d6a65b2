"""A bind takes its pod's assumed allocation as it is only when nothing that placement
rested on changed (the request, the node's row, the policy, the constraints); otherwise it
decides again. And the cache's cheap paths around a bind (a ledger's entries held once,
their times read once) see every change."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract.annotations import decode
from gpupool.core.placement import Placement
from gpupool.extender.state.ledger import Entry

from .builders import Replica
from .test_assumptions import bind_body, scores, seeded
from .test_cache_watch_events import alloc, cache_with_node, ledger

SLICE = {"gpupool.io/gpu-memory": "8192", "gpupool.io/gpu-core": "30"}


def counting_decisions(replica: Replica) -> list[int]:
    """Count the placer's decisions from now on (the same placer object: a bind compares
    it by identity)."""
    placer = replica.extender.placer
    decide: Callable[..., Placement] = placer.decide
    calls: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Placement:
        calls.append(1)
        return decide(*args, **kwargs)
    placer.decide = counted  # type: ignore[method-assign]
    return calls


def top(replica: Replica, pod: dict[str, Any], nodes: list[str]) -> str:
    ranked = scores(replica.extender, pod, nodes)
    return max(ranked, key=lambda n: ranked[n])


def bound_allocation(fake: FakeApiServer, pod: dict[str, Any]) -> Any:
    meta = pod["metadata"]
    stored = fake.get("pods", meta["name"], meta["namespace"])
    return decode(meta["uid"], stored["metadata"]["annotations"]).allocation


def test_a_bind_whose_assumption_stands_binds_the_assumed_allocation_without_deciding(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    (a,) = seeded(fake, replica, names=("a",), limits=SLICE)
    node = top(replica, a, nodes)
    assumed = replica.cache.state.allocations[a["metadata"]["uid"]]
    calls = counting_decisions(replica)
    assert replica.extender.bind(bind_body(a, node))["Error"] == ""
    assert calls == []
    assert bound_allocation(fake, a).slices == assumed.slices


def test_a_bind_decides_again_when_its_node_changed_after_the_assumption(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    a, b = seeded(fake, replica, limits=SLICE)
    node = top(replica, a, nodes)
    ext = replica.extender
    assert ext.filter({"Pod": b, "NodeNames": [node]})["NodeNames"] == [node]
    assert ext.bind(bind_body(b, node))["Error"] == ""  # b now holds room on a's node
    calls = counting_decisions(replica)
    assert ext.bind(bind_body(a, node))["Error"] == ""
    assert calls == [1]


def test_a_bind_decides_again_for_the_pod_as_the_api_server_has_it(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    (a,) = seeded(fake, replica, names=("a",), limits=SLICE)
    sent = {**a, "spec": {**a["spec"], "containers": [
        {**c, "resources": {"limits": {**SLICE, "gpupool.io/gpu-memory": "16384"}}}
        for c in a["spec"]["containers"]]}}
    node = top(replica, sent, nodes)  # assumed for the body's 16 GiB
    assert replica.cache.state.allocations[a["metadata"]["uid"]].slices[0].memory_mib == 16384
    calls = counting_decisions(replica)
    assert replica.extender.bind(bind_body(a, node))["Error"] == ""
    assert calls == [1]
    assert [s.memory_mib for s in bound_allocation(fake, a).slices] == [8192]


def test_an_entry_let_go_before_a_bind_is_held_again_by_the_ledgers_next_version() -> None:
    cache = cache_with_node()
    cache.ledger_event("MODIFIED", ledger("7", "a", "b"))
    with cache.lock:
        cache.readopt("a")  # a's bind let its own entry go to decide again
    assert set(cache.state.allocations) == {"b"}
    cache.ledger_event("MODIFIED", ledger("8", "a", "b"))  # the same entries, a newer write
    assert set(cache.state.allocations) == {"a", "b"}


def test_an_entry_reads_the_times_it_carries_including_after_a_change() -> None:
    first = Entry(alloc("a", 0), "default/a", "2026-01-01T00:00:00Z")
    assert first.bind_s == 1767225600.0 and first.expires_s is None
    later = replace(first, bind_time="2026-01-01T00:00:10Z", kind="hold",
                    expires="2026-01-01T00:01:00Z")
    assert (later.bind_s, later.expires_s) == (1767225610.0, 1767225660.0)
    assert first.bind_s == 1767225600.0  # the first entry's own reading is kept
    assert first == Entry(alloc("a", 0), "default/a", "2026-01-01T00:00:00Z")
    assert Entry(alloc("a", 0), "default/a", "not a time").bind_s is None
