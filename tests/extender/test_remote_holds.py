"""A preemption hold on the ledger of the GPU node that would serve a pending remote pod's
slice (FAKE API server, a real extender replica): while it lives, a pod of lower priority
arriving after is refused that room; the pod it is for is served there and its bind
replaces the hold; an expired hold keeps nothing. The extender's remote placement reads
holds as its local placement does: this is the behaviour a writer of such holds (the
controller's remote preemption, docs/remote.md) relies on."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract import names
from gpupool.controller.catalogue import catalogue_of
from gpupool.controller.loop import Controller, TenancyWorld
from gpupool.controller.remotepreempt import PreemptionConfig, RemotePlanner, RoundPlan
from gpupool.controller.remotepreemptor import RemotePreemptor
from gpupool.core.allocation import Allocation, Slice
from gpupool.extender.state.ledger import HOLD, Entry
from gpupool.kube.controller_ops import ControllerApi
from gpupool.kube.keystore import read_signing_keys
from gpupool.security.signing import claims_of
from tests.waiting import wait_for

from .builders import NAMESPACE, Replica
from .test_remote_slices import ALL, SERVING, bind, in_state, local, remote, seed, served_by


def stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def replica(fake: FakeApiServer) -> Iterator[Replica]:
    """Zone a's two GPUs full; gpu-b1 (zone b) free."""
    seed(fake)
    r = Replica(fake, serving=SERVING)
    assert wait_for(lambda: in_state(r) == len(ALL))
    for n in ("gpu-a1", "gpu-a2"):
        assert bind(r, fake.seed("pods", local(f"fill-{n}", 40960)), n) == ""
    yield r
    r.close()


def hold_for(fake: FakeApiServer, r: Replica, pod: dict[str, Any], expires: float) -> str:
    """A hold of 30000 MiB of gpu-b1 for ``pod`` in gpu-b1's GPULedger, seen by ``r``."""
    uid = pod["metadata"]["uid"]
    alloc = Allocation(uid, "gpu-b1", 0, 0, (Slice("GPU-gpu-b1-0", 0, 30000, 0),))
    entry = Entry(alloc, f"default/{pod['metadata']['name']}", stamp(time.time()), "default",
                  kind=HOLD, expires=stamp(expires))
    fake.seed("gpuledgers", {"apiVersion": names.API_VERSION, "kind": "GPULedger",
                             "metadata": {"name": "gpu-b1"},
                             "spec": {"node": "gpu-b1", "entries": {uid: entry.to_json()}}})
    assert wait_for(lambda: uid in r.cache.holds)
    return str(uid)


def test_a_live_hold_keeps_the_serving_room_for_its_remote_pod_alone(
        fake: FakeApiServer, replica: Replica) -> None:
    pre = fake.seed("pods", remote("pre", 30000, priority=1000))
    uid = hold_for(fake, replica, pre, time.time() + 120)
    other = fake.seed("pods", remote("other", 30000, priority=1))
    error = bind(replica, other, "cpu-b")
    assert "any node: none of its 2 other nodes with GPUs has room" in error
    assert bind(replica, pre, "cpu-b") == ""
    assert served_by(fake, pre) == "gpu-b1"  # where the room was held
    entry = (fake.get("gpuledgers", "gpu-b1") or {})["spec"]["entries"][uid]
    assert "kind" not in entry and '"node":"cpu-b"' in entry["allocation"]  # its bind now


def test_an_expired_hold_keeps_nothing(fake: FakeApiServer, replica: Replica) -> None:
    pre = fake.seed("pods", remote("pre", 30000, priority=1000))
    hold_for(fake, replica, pre, time.time() - 1)
    other = fake.seed("pods", remote("other", 30000, priority=1))
    assert bind(replica, other, "cpu-b") == ""
    assert served_by(fake, other) == "gpu-b1"


# -- the controller's remote preemption writes the hold, a real extender replica honours it --

def controller_round(fake: FakeApiServer, clock: Callable[[], float]) -> RoundPlan:
    """One round of the controller's remote preemption (grace 0) on ``fake``, counting the
    decisions the extender replica signed."""
    api = ControllerApi.open(server=fake.url)
    try:
        ring = read_signing_keys(api, NAMESPACE)[0].public()

        def verify(uid: str, ns: str, name: str, notes: Any, signature: str | None) -> str:
            return ring.verify(claims_of(uid, ns, name, notes), signature)

        controller = Controller(api, verify=verify)
        observed = controller.list_world()
        labels, permissions, quotas, _ = TenancyWorld.listed(api).snapshot()
        preemptor = RemotePreemptor(api, RemotePlanner(PreemptionConfig(grace_s=0.0)),
                                    clock=clock)
        return preemptor.round(observed, controller.listed_pods, labels,
                               catalogue_of(observed, quotas, permissions))
    finally:
        api.close()


def refused_by_scheduler(pod: dict[str, Any]) -> dict[str, Any]:
    pod["status"] = {"phase": "Pending", "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "lastTransitionTime": stamp(time.time() - 3600), "message": "gpupool: no room"}]}
    return pod


@pytest.fixture
def evicting(fake: FakeApiServer, replica: Replica) -> dict[str, Any]:
    """Zone a's GPUs full with pods of priority 5000 (nobody's victims); low (priority 1)
    served by gpu-b1; pre (priority 1000) pending, refused by kube-scheduler."""
    for p in fake.objects("pods"):
        fake.delete("pods", p["metadata"]["name"], p["metadata"]["namespace"])
    for n in ("gpu-a1", "gpu-a2"):
        fill = local(f"top-{n}", 40960)
        fill["spec"]["priority"] = 5000
        assert bind(replica, fake.seed("pods", fill), n) == ""
    low = fake.seed("pods", remote("low", 30000, priority=1))
    assert bind(replica, low, "cpu-b") == "" and served_by(fake, low) == "gpu-b1"
    return fake.seed("pods", refused_by_scheduler(remote("pre", 30000, priority=1000)))


def test_the_controllers_hold_expires_when_the_preemptor_never_comes(
        fake: FakeApiServer, replica: Replica, evicting: dict[str, Any]) -> None:
    controller_round(fake, lambda: time.time() - 600)  # its hold expired long ago
    assert fake.get("pods", "low", "default") is None
    other = fake.seed("pods", remote("other", 30000, priority=1))
    assert bind(replica, other, "cpu-b") == ""
    assert served_by(fake, other) == "gpu-b1"


def test_the_controllers_hold_keeps_the_freed_room_from_a_pod_of_lower_priority(
        fake: FakeApiServer, replica: Replica, evicting: dict[str, Any]) -> None:
    controller_round(fake, time.time)
    assert fake.get("pods", "low", "default") is None  # evicted
    uid = evicting["metadata"]["uid"]
    assert wait_for(lambda: uid in replica.cache.holds)
    assert wait_for(lambda: "low" not in {f.name for f in replica.cache.pods.values()})
    assert wait_for(lambda: uid in replica.cache.state.allocations)  # the room is its
    other = fake.seed("pods", remote("other", 30000, priority=1))
    assert "none of its 2 other nodes with GPUs has room" in bind(replica, other, "cpu-b")
    assert bind(replica, evicting, "cpu-b") == ""
    assert served_by(fake, evicting) == "gpu-b1"
