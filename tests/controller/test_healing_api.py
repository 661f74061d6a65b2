"""Healing through the API: evictions (a PodDisruptionBudget's 429 honoured), Events,
metrics, opt-out, and the RBAC it needs — the controller's real client against the FAKE
API server."""

from __future__ import annotations

import threading
import time
from typing import Any

from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.controller.evictions import Evictor
from gpupool.controller.healing import ANNOTATION_HEALING, Healer, HealingConfig
from gpupool.controller.loop import Controller
from gpupool.controller.metrics import ControllerMetrics
from gpupool.kube.controller_ops import ControllerApi
from tests.rbac_grants import grants, manifest, needed, refused, writes
from tests.waiting import wait_for

from .builders import GIB, device, placed_pod, slices, verify


def seed(fake: FakeApiServer) -> None:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for i, healthy in ((0, False), (1, True)):
        obj = device("n1", i)
        obj["status"] = {"health": "Healthy" if healthy else "Unhealthy",
                         "reason": "critical XID 79", "heartbeatTime": now}
        fake.seed("gpudevices", obj)
    kept = placed_pod("kept", "lab", "n1", slices("n1", (0, GIB, 10)))
    kept["metadata"]["annotations"][ANNOTATION_HEALING] = "off"
    for pod in (placed_pod("broken", "lab", "n1", slices("n1", (0, GIB, 10))), kept,
                placed_pod("fine", "lab", "n1", slices("n1", (1, GIB, 10)))):
        fake.seed("pods", pod)


def events(fake: FakeApiServer) -> list[tuple[str, str]]:
    return sorted((e["reason"], e["involvedObject"]["name"]) for e in fake.objects("events"))


def pods(fake: FakeApiServer) -> set[str]:
    return {p["metadata"]["name"] for p in fake.objects("pods")}


def run(api: ControllerApi, evictor: Evictor, until: Any) -> None:
    stop = threading.Event()
    thread = threading.Thread(target=Controller(api, verify=verify, evictor=evictor).run,
                              args=(stop, 60.0, None, 1))
    thread.start()
    try:
        assert wait_for(until)
    finally:
        stop.set()
        thread.join(30)


def test_the_pods_of_a_failed_gpu_are_evicted_past_a_budget_once_it_allows(
        ) -> None:
    metrics = ControllerMetrics()
    with FakeApiServer() as fake:
        seed(fake)
        fake.fail_next("POST", "eviction", 429, "Cannot evict pod as it would violate the "
                                                "pod's disruption budget.")
        api = ControllerApi.open(server=fake.url)
        healer = Healer(HealingConfig(unhealthy_for_s=0, retry_s=0.5))
        try:
            run(api, Evictor(api, healer, metrics.healed), lambda: "broken" not in pods(fake))
        finally:
            api.close()
        assert pods(fake) == {"kept", "fine"}  # opted out, and on a healthy GPU
        assert events(fake) == [("GpupoolHealing", "broken"), ("GpupoolHealing", "broken"),
                                ("GpupoolHealingBlocked", "broken"),
                                ("GpupoolHealingSkipped", "kept")]
        calls = needed(fake.requests)
    blocked = metrics.healing.labels("gpu-unhealthy", "blocked")._value.get()
    evicted = metrics.healing.labels("gpu-unhealthy", "evicted")._value.get()
    skipped = metrics.healing.labels("gpu-unhealthy", "opted-out")._value.get()
    assert (blocked, evicted, skipped) == (1, 1, 1)
    rules = grants(manifest("controller", "rbac.yaml"), "gpupool-controller")
    assert refused(calls, rules) == set()
    assert {("", "pods/eviction"), ("", "events")} <= writes(calls)
    assert ("", "pods") not in writes(calls)  # evicted through the API server, never deleted


def test_no_healing_without_an_evictor_and_nothing_on_healthy_gpus() -> None:
    with FakeApiServer() as fake:
        seed(fake)
        api = ControllerApi.open(server=fake.url)
        try:
            stop = threading.Event()
            thread = threading.Thread(target=Controller(api, verify=verify).run,
                                      args=(stop, 60.0, None, 1))
            thread.start()
            time.sleep(1.0)
            stop.set()
            thread.join(30)
        finally:
            api.close()
        assert pods(fake) == {"broken", "kept", "fine"} and events(fake) == []
