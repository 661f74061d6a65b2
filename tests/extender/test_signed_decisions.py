"""The extender counts a recorded decision only when it can vouch for it: a forged decision
(``spec.nodeName`` plus hand-written annotations), a decision copied to another pod, one
field edited, an unknown key, or a decision on a CPU-only pod never makes a GPU taken —
in the watch, and in the rebuild after a restart — while the pod's CPU and memory
still count."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer
from prometheus_client import generate_latest
from waiting import wait_for

from gpupool.contract import names
from gpupool.contract.annotations import encode
from gpupool.core.allocation import Allocation, Slice
from gpupool.extender.state.signatures import DecisionCheck, DecisionKeys
from gpupool.kube.keystore import rotate
from gpupool.security.signing import Claims, SigningKeys, claims_of

from .builders import NAMESPACE, Replica, local_keys, pod_obj, schedule, signed

WHOLE = {"gpupool.io/gpu": "2"}


def exclusive(uid: str, node: str) -> Allocation:
    return Allocation(uid, node, 1000, 1024, tuple(
        Slice(f"GPU-{node}-{j}", j, 40960, 100, "c0") for j in range(2)), exclusive=True)


def bound(fake: FakeApiServer, name: str, node: str, notes: dict[str, str] | None,
          limits: dict[str, str] | None = None, cpu: str = "1", uid: str | None = None
          ) -> dict[str, Any]:
    """A pod created already bound (spec.nodeName set by its author, no scheduler)."""
    pod = pod_obj(name, WHOLE if limits is None else limits, cpu=cpu)
    pod["metadata"]["uid"] = uid or f"uid-{name}"
    pod["metadata"]["annotations"] = notes or {}
    pod["spec"]["nodeName"] = node
    pod["status"]["phase"] = "Running"
    return fake.seed("pods", pod)


def two_gpu_pod_fits(replica: Replica, node: str) -> bool:
    probe = pod_obj("probe", WHOLE)
    probe["metadata"]["uid"] = "probe"
    return replica.extender.filter({"Pod": probe, "NodeNames": [node]})["NodeNames"] == [node]


def unverified(replica: Replica) -> str:
    return generate_latest(replica.extender.metrics.registry).decode()


def settled(replica: Replica, uid: str) -> bool:
    with replica.cache.lock:
        replica.cache.flush()
        return uid in replica.cache.pods


def test_a_forged_decision_holds_no_gpu_but_its_cpu_still_counts(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    notes = encode(exclusive("uid-forged", nodes[0]), "2026-01-01T00:00:00Z")
    bound(fake, "forged", nodes[0], notes, cpu="60")
    assert wait_for(lambda: settled(replica, "uid-forged"))
    assert two_gpu_pod_fits(replica, nodes[0])  # both GPUs free for a real pod
    cpu_hungry = pod_obj("cpu", WHOLE, cpu="8")
    cpu_hungry["metadata"]["uid"] = "cpu"
    answer = replica.extender.filter({"Pod": cpu_hungry, "NodeNames": [nodes[0]]})
    assert answer["NodeNames"] == []  # 60 of 64 CPUs are the forged pod's: they count
    assert 'gpupool_extender_unverified_decisions_total{reason="unsigned"} 1.0' in \
        unverified(replica)


@pytest.mark.parametrize("attack", ["copied to another pod", "allocation edited",
                                    "bind time edited", "group added", "unknown key",
                                    "on a CPU-only pod"])
def test_a_tampered_decision_holds_no_gpu(attack: str, fake: FakeApiServer, replica: Replica,
                                          nodes: list[str]) -> None:
    node = nodes[0]
    alloc = exclusive("uid-victim", node)
    notes = signed(replica.keys, alloc, "default", "victim")
    uid, limits, reason = "uid-victim", WHOLE, "invalid"
    if attack == "copied to another pod":
        uid = "uid-copy"
    elif attack == "allocation edited":
        raw = json.loads(notes[names.ANNOTATION_ALLOCATION])
        raw["containers"][0]["gpus"][1]["memoryMiB"] = 20480
        notes[names.ANNOTATION_ALLOCATION] = json.dumps(raw, separators=(",", ":"),
                                                        sort_keys=True)
    elif attack == "bind time edited":
        notes[names.ANNOTATION_BIND_TIME] = "2026-01-02T00:00:00Z"
    elif attack == "group added":
        notes[names.ANNOTATION_RESOURCE_GROUP] = "team-a"
    elif attack == "unknown key":
        notes = signed(local_keys(), alloc, "default", "victim")
        reason = "unknown-key"
    elif attack == "on a CPU-only pod":
        limits, reason = {}, "not-a-gpu-pod"
    bound(fake, "victim", node, notes, limits, uid=uid)
    assert wait_for(lambda: settled(replica, uid))
    assert two_gpu_pod_fits(replica, node)
    assert f'gpupool_extender_unverified_decisions_total{{reason="{reason}"}} 1.0' in \
        unverified(replica)


def test_a_restarted_replica_counts_only_the_decisions_it_can_vouch_for(
        fake: FakeApiServer, nodes: list[str]) -> None:
    first = Replica(fake)
    try:
        legit = fake.seed("pods", pod_obj("legit", WHOLE))
        assert schedule(first.extender, legit, [nodes[1]]) == (nodes[1], "")
        copied = dict(fake.get("pods", "legit", "default")["metadata"]["annotations"])
    finally:
        first.close()
    bound(fake, "forged", nodes[0], encode(exclusive("uid-forged", nodes[0]),
                                           "2026-01-01T00:00:00Z"))
    copy = {**copied, names.ANNOTATION_NODE: nodes[2]}
    bound(fake, "copy", nodes[2], copy)
    fake.delete("gpuledgers", nodes[1])  # the signature alone must vouch for the legit one
    second = Replica(fake)
    try:
        held = {k: a.node for k, a in second.cache.state.allocations.items() if a.slices}
        assert held == {legit["metadata"]["uid"]: nodes[1]}
        assert two_gpu_pod_fits(second, nodes[0]) and two_gpu_pod_fits(second, nodes[2])
        assert not two_gpu_pod_fits(second, nodes[1])
    finally:
        second.close()


def test_a_decision_signed_with_a_rotated_in_key_is_counted_once_the_key_is_read(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    keys = rotate(replica.api, NAMESPACE, time.time(), delay_s=0)  # another replica's work
    newest = DecisionKeys(lambda: keys, time.time, keys=keys)
    replica.keys.refresh_s = 0  # read again at once on an unknown key id
    bound(fake, "fresh", nodes[0], signed(newest, exclusive("uid-fresh", nodes[0]), "default",
                                          "fresh"))
    assert wait_for(lambda: settled(replica, "uid-fresh"))
    assert not two_gpu_pod_fits(replica, nodes[0])


def test_verdicts_are_remembered_per_claims_and_signature_never_per_uid() -> None:
    keys = SigningKeys().added(0)
    check = DecisionCheck(DecisionKeys(lambda: keys, time.time, keys=keys))
    notes = encode(exclusive("u1", "n0"), "2026-01-01T00:00:00Z")
    claims = Claims("u1", "ns", "p", "n0", "2026-01-01T00:00:00Z", "",
                    notes[names.ANNOTATION_ALLOCATION])
    notes[names.ANNOTATION_SIGNATURE] = keys.active(1).sign(claims)
    for _ in range(3):
        assert check.counts("u1", "ns", "p", notes, asks_gpu=True)
    assert check.verifier is not None
    assert (check.verifier.stats().checked, check.verifier.stats().remembered) == (1, 2)
    other = {**notes, names.ANNOTATION_BIND_TIME: "2026-01-03T00:00:00Z"}
    assert not check.counts("u1", "ns", "p", other, asks_gpu=True)  # same uid, new claims
    assert check.verifier.stats().checked == 2


def test_a_decision_of_a_retired_key_stops_counting_once_the_keys_are_read_again() -> None:
    old = SigningKeys().added(0)
    both = old.added(1)
    held = [both]
    keys = DecisionKeys(lambda: held[0], time.time, keys=both)
    check = DecisionCheck(keys)
    notes = encode(exclusive("u1", "n0"), "2026-01-01T00:00:00Z")
    claims = Claims("u1", "ns", "p", "n0", "2026-01-01T00:00:00Z", "",
                    notes[names.ANNOTATION_ALLOCATION])
    notes[names.ANNOTATION_SIGNATURE] = old.active(1).sign(claims)
    assert check.counts("u1", "ns", "p", notes, asks_gpu=True)
    held[0] = both.without([old.keys[0].kid])  # retired with --force by another replica
    keys.reload()  # the extender's timer
    assert not check.counts("u1", "ns", "p", notes, asks_gpu=True)


def test_a_signature_the_extender_just_made_is_remembered_for_its_watch() -> None:
    keys = SigningKeys().added(0)
    check = DecisionCheck(DecisionKeys(lambda: keys, time.time, keys=keys))
    notes = encode(exclusive("u1", "n0"), "2026-01-01T00:00:00Z")
    claims = claims_of("u1", "ns", "p", notes)
    notes[names.ANNOTATION_SIGNATURE] = signature = keys.active(1).sign(claims)
    check.vouch(claims, signature)
    assert check.counts("u1", "ns", "p", notes, asks_gpu=True)
    assert check.verifier is not None
    assert (check.verifier.stats().checked, check.verifier.stats().remembered) == (1, 1)
