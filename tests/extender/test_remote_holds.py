"""A preemption hold on the ledger of the GPU node that would serve a pending remote pod's
slice (FAKE API server, a real extender replica): while it lives, a pod of lower priority
arriving after is refused that room; the pod it is for is served there and its bind
replaces the hold; an expired hold keeps nothing. The extender's remote placement reads
holds as its local placement does: this is the behaviour a writer of such holds (the
controller's remote preemption, docs/remote.md) relies on."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract import names
from gpupool.core.allocation import Allocation, Slice
from gpupool.extender.state.ledger import HOLD, Entry
from tests.waiting import wait_for

from .builders import Replica
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
