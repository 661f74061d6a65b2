"""The controller counts a decision only if gpupool signed it for that pod and the pod asks
a gpupool GPU: forged, copied, edited, foreign-key and CPU-pod decisions hold nothing and
are reported by pod and reason."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract import names
from gpupool.controller.loop import Controller
from gpupool.controller.observed import observe
from gpupool.controller.reconcile import GROUP, reconcile
from gpupool.kube.controller_ops import ControllerApi
from gpupool.kube.keystore import PUBLIC_CONFIG_MAP, KeyRingSource
from gpupool.kube.verifier import DecisionVerifier
from gpupool.security.signing import SigningKeys
from tests.controller.builders import (
    GIB,
    KEYS,
    RING,
    device,
    group,
    placed_pod,
    sign,
    slices,
    verify,
)

NOW = "2026-01-02T03:04:05Z"


def good(name: str = "a") -> dict[str, Any]:
    return placed_pod(name, "lab", "n1", slices("n1", (0, 8 * GIB, 30)), group_name="team")


def copied_onto_another_pod() -> dict[str, Any]:
    pod = good("thief")
    pod["metadata"]["annotations"] = copy.deepcopy(good("a")["metadata"]["annotations"])
    return pod


def edited() -> dict[str, Any]:
    pod = good()
    notes = pod["metadata"]["annotations"]
    notes[names.ANNOTATION_ALLOCATION] = notes[names.ANNOTATION_ALLOCATION].replace(
        '"memoryMiB":8192', '"memoryMiB":81920')
    return pod


def forged_unsigned() -> dict[str, Any]:
    pod = good()
    del pod["metadata"]["annotations"][names.ANNOTATION_SIGNATURE]
    return pod


def signed_with_an_unknown_key() -> dict[str, Any]:
    return sign(good(), SigningKeys().added(0.0))


def on_a_cpu_only_pod() -> dict[str, Any]:
    pod = good()
    pod["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    return sign(pod)


@pytest.mark.parametrize(("make", "words"), [
    (forged_unsigned, "carries no gpupool.io/signature"),
    (copied_onto_another_pod, "does not match it (edited, or copied from another pod)"),
    (edited, "does not match it"),
    (signed_with_an_unknown_key, "not one of gpupool's published decision keys"),
    (on_a_cpu_only_pod, "the pod asks no gpupool GPU resource"),
])
def test_an_unverifiable_decision_holds_nothing_and_is_reported(make: Any, words: str) -> None:
    pod = make()
    seen = observe([device("n1", 0)], [], [group("team", nodes=["n1"])], [pod], verify)
    assert seen.holdings == () and seen.unreadable_pods == ()
    [problem] = seen.problems
    assert problem.kind == "Pod" and problem.name == f"lab/{pod['metadata']['name']}"
    assert "its decision is not counted" in problem.message and words in problem.message
    plan = reconcile(seen, NOW)
    status = next(a.patch for a in plan.actions if getattr(a, "kind", "") == GROUP)
    assert status["pods"] == 0
    assert any(words in note for note in plan.notes)


def test_a_signed_decision_counts_and_without_verification_an_unsigned_one_does_too() -> None:
    assert len(observe([], [], [], [good()], verify).holdings) == 1
    assert len(observe([], [], [], [forged_unsigned()], None).holdings) == 1


def test_verification_is_remembered_per_signed_content_never_per_uid() -> None:
    remembered = DecisionVerifier(lambda wanted: RING)  # what KeyRingSource.verify uses
    pod = good()
    for _ in range(3):
        assert len(observe([], [], [], [pod], remembered.verify).holdings) == 1
    assert (remembered.stats().checked, remembered.stats().remembered) == (1, 2)
    seen = observe([], [], [], [edited()], remembered.verify)  # same uid, other content
    assert seen.holdings == () and remembered.stats().checked == 2
    assert "does not match it" in seen.problems[0].message


def test_a_retired_key_stops_counting_at_the_next_round_though_remembered() -> None:
    ring = [RING]
    remembered = DecisionVerifier(lambda wanted: ring[0])
    assert len(observe([], [], [], [good()], remembered.verify).holdings) == 1
    ring[0] = KEYS.without([KEYS.keys[0].kid]).public()  # retired (--force)
    seen = observe([], [], [], [good()], remembered.verify)
    assert seen.holdings == ()
    assert "not one of gpupool's published decision keys" in seen.problems[0].message


def test_the_controller_leaves_a_forged_pod_out_of_the_groups_numbers() -> None:
    with FakeApiServer() as fake:
        fake.seed("gpudevices", device("n1", 0))
        fake.seed("resourcegroups", group("team", nodes=["n1"], quota={"gpus": 1}))
        fake.seed("configmaps", {"metadata": {"name": PUBLIC_CONFIG_MAP,
                                              "namespace": "gpupool-system"},
                                 "data": RING.to_data()})
        fake.seed("pods", good("real"))
        forged = placed_pod("forged", "lab", "n1", slices("n1", (0, 80 * GIB, 100)),
                            exclusive=True, group_name="team")
        del forged["metadata"]["annotations"][names.ANNOTATION_SIGNATURE]
        fake.seed("pods", forged)
        api = ControllerApi.open(server=fake.url)
        try:
            source = KeyRingSource(api, "gpupool-system", time.time)
            controller = Controller(api, clock=lambda: NOW, verify=source.verify)
            out = controller.reconcile_once()
            again = controller.reconcile_once()  # the next round: outcomes remembered
        finally:
            api.close()
        status = (fake.get("resourcegroups", "team") or {})["status"]
    assert status["pods"] == 1
    assert status["quota"]["allocated"]["gpus"] == 1
    for outcome in (out, again):
        assert any(n.startswith("Pod lab/forged: its decision is not counted")
                   for n in outcome.notes)
    assert (source.stats().checked, source.stats().remembered) == (2, 2)


def test_while_the_keys_cannot_be_read_no_decision_counts() -> None:
    with FakeApiServer() as fake:
        api = ControllerApi.open(server=fake.url)
        try:
            source = KeyRingSource(api, "gpupool-system", time.time)
            seen = observe([], [], [], [good()], source.verify)
        finally:
            api.close()
    assert seen.holdings == ()
    assert "decision keys cannot be read" in seen.problems[0].message
