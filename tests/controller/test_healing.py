"""Healing, planned: which pods of failed GPUs and silent nodes are evicted, when, how often."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.contract.devices import read_device
from gpupool.controller.healing import (
    ANNOTATION_HEALING,
    Cause,
    Healer,
    HealingConfig,
    Outcome,
)
from gpupool.controller.observed import observe

from .builders import GIB, device, placed_pod, slices, verify

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def stamp(s: float) -> str:
    from datetime import UTC, datetime
    return datetime.fromtimestamp(s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def gpu(node: str, index: int, healthy: bool = True, beat: float = T0) -> dict[str, Any]:
    obj = device(node, index)
    obj["status"] = {"health": "Healthy" if healthy else "Unhealthy",
                     "heartbeatTime": stamp(beat)}
    return obj


class World:
    def __init__(self) -> None:
        self.devices = [gpu("n1", 0), gpu("n1", 1), gpu("n2", 0)]
        self.pods = [placed_pod("a", "lab", "n1", slices("n1", (0, GIB, 10))),
                     placed_pod("b", "lab", "n1", slices("n1", (1, GIB, 10))),
                     placed_pod("c", "lab", "n2", slices("n2", (0, GIB, 10)))]

    def plan(self, healer: Healer, now: float) -> Any:
        observed = observe(self.devices, [], [], self.pods, verify)
        return healer.plan([read_device(d) for d in self.devices], observed.holdings,
                           {p["metadata"]["uid"]: p for p in self.pods}, now)

    def pod(self, name: str) -> dict[str, Any]:
        return next(p for p in self.pods if p["metadata"]["name"] == name)


def names(evictions: Any) -> list[str]:
    return [e.name for e in evictions]


def test_the_pods_of_a_gpu_unhealthy_past_the_grace_are_evicted_once() -> None:
    w, healer = World(), Healer(HealingConfig(unhealthy_for_s=60))
    w.devices[0] = gpu("n1", 0, healthy=False)
    first = w.plan(healer, T0 + 1)
    assert first.evict == () and first.next_s == T0 + 61  # the grace: look again then
    plan = w.plan(healer, T0 + 61)
    assert names(plan.evict) == ["a"]  # only the pod holding the failed GPU
    (e,) = plan.evict
    assert e.cause is Cause.GPU_UNHEALTHY and "GPU-n1-0 on node n1" in e.reason
    healer.record(e, Outcome.EVICTED, T0 + 61)
    assert w.plan(healer, T0 + 62).evict == ()  # never again: no loop


def test_a_gpu_that_recovers_within_the_grace_heals_nobody_and_starts_afresh() -> None:
    w, healer = World(), Healer(HealingConfig(unhealthy_for_s=60))
    w.devices[0] = gpu("n1", 0, healthy=False)
    w.plan(healer, T0)
    w.devices[0] = gpu("n1", 0)
    assert w.plan(healer, T0 + 30).evict == ()
    w.devices[0] = gpu("n1", 0, healthy=False)
    assert w.plan(healer, T0 + 70).evict == ()  # unhealthy again since T0 + 70 only
    assert names(w.plan(healer, T0 + 130).evict) == ["a"]


def test_every_gpu_pod_of_a_silent_node_is_evicted() -> None:
    w, healer = World(), Healer(HealingConfig(silent_for_s=300))
    w.devices[2] = gpu("n2", 0, beat=T0 + 280)  # n2 still reports
    assert w.plan(healer, T0 + 299).evict == ()
    plan = w.plan(healer, T0 + 300)
    assert names(plan.evict) == ["a", "b"]
    assert {e.cause for e in plan.evict} == {Cause.NODE_SILENT}
    assert "node agent of n1 has not reported for 300 s" in plan.evict[0].reason


def test_a_pod_that_opts_out_stays_and_is_reported_once() -> None:
    w, healer = World(), Healer(HealingConfig(unhealthy_for_s=0))
    w.devices[0] = gpu("n1", 0, healthy=False)
    w.pod("a")["metadata"]["annotations"][ANNOTATION_HEALING] = "off"
    plan = w.plan(healer, T0)
    assert plan.evict == () and names(plan.opted_out) == ["a"]
    assert w.plan(healer, T0 + 1).opted_out == ()


def test_a_refused_eviction_is_tried_again_after_the_retry_and_a_deleting_pod_is_left(
        ) -> None:
    w, healer = World(), Healer(HealingConfig(unhealthy_for_s=0, retry_s=60))
    w.devices[0] = gpu("n1", 0, healthy=False)
    (e,) = w.plan(healer, T0).evict
    healer.record(e, Outcome.BLOCKED, T0)
    later = w.plan(healer, T0 + 30)
    assert later.evict == () and later.next_s == T0 + 60
    assert names(w.plan(healer, T0 + 60).evict) == ["a"]
    w.pod("a")["metadata"]["deletionTimestamp"] = stamp(T0 + 61)
    assert w.plan(healer, T0 + 200).evict == ()


def test_evictions_are_rate_limited_and_the_rest_deferred() -> None:
    w, healer = World(), Healer(HealingConfig(silent_for_s=1, per_minute=1))
    plan = w.plan(healer, T0 + 10)  # every node silent: a, b, c
    assert names(plan.evict) == ["a"] and names(plan.deferred) == ["b", "c"]
    healer.record(plan.evict[0], Outcome.EVICTED, T0 + 10)
    assert w.plan(healer, T0 + 40).evict == ()
    assert names(w.plan(healer, T0 + 70).evict) == ["b"]


def test_a_pod_whose_decision_does_not_count_is_never_healed() -> None:
    w, healer = World(), Healer(HealingConfig(unhealthy_for_s=0))
    w.devices[0] = gpu("n1", 0, healthy=False)
    w.pod("a")["metadata"]["annotations"]["gpupool.io/signature"] = "forged"
    assert w.plan(healer, T0).evict == ()


@pytest.mark.parametrize("config", [HealingConfig(enabled=False)])
def test_healing_off_plans_nothing(config: HealingConfig) -> None:
    w = World()
    w.devices = [gpu("n1", 0, healthy=False, beat=T0 - 10_000)]
    assert w.plan(Healer(config), T0).evict == ()
