"""Two controller replicas elect a leader through a Lease on the FAKE API server (real
HTTP, real lightkube): exactly one leads, the other takes over when it stops or is cut
off, and a leader that cannot renew stops reconciling.

Threads and a real HTTP server on a machine that may be loaded: a Lease call may take longer
than a retry period (the calls time out after one), so a short renew deadline could end a
term the test did not mean to end. Tests that do not wait out a Lease use STEADY (a renew
deadline no loaded machine reaches); the one that must wait one out uses FAST. The exact
timing rules are checked on a fake clock in tests/controller/test_leader.py; here the order
of events and generous bounds are."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.controller.leader import ElectionTiming, LeaderElector, lead
from gpupool.controller.loop import Controller
from gpupool.kube.api import KubeApi
from gpupool.kube.controller_ops import ControllerApi
from gpupool.kube.lease import LeaseLock
from tests.controller.builders import device
from tests.waiting import wait_for

NS, NAME = "gpupool-system", "gpupool-controller"
FAST = ElectionTiming(lease_duration_s=3, renew_deadline_s=2, retry_period_s=0.5)
STEADY = ElectionTiming(lease_duration_s=30, renew_deadline_s=20, retry_period_s=0.25)
MICRO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


@dataclass
class Candidate:
    api: KubeApi
    elector: LeaderElector
    stop: threading.Event
    thread: threading.Thread

    def halt(self) -> None:
        self.stop.set()
        self.thread.join(30)


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


def candidate(fake: FakeApiServer, who: str, timing: ElectionTiming = STEADY) -> Candidate:
    api = KubeApi.connect(server=fake.url, timeout_s=timing.retry_period_s)
    elector = LeaderElector(LeaseLock(api, NS, NAME), who, timing)
    stop = threading.Event()
    thread = threading.Thread(target=elector.run, args=(stop,), daemon=True)
    thread.start()
    return Candidate(api, elector, stop, thread)


def leaders(*cs: Candidate) -> list[str]:
    return [c.elector.identity for c in cs if c.elector.is_leader()]


def test_of_two_replicas_exactly_one_leads_and_the_lease_says_which(
        fake: FakeApiServer) -> None:
    a, b = candidate(fake, "ctl-a_1"), candidate(fake, "ctl-b_2")
    try:
        assert wait_for(lambda: len(leaders(a, b)) == 1)
        deadline = time.monotonic() + 1.5  # several renewals: still exactly one
        while time.monotonic() < deadline:
            assert len(leaders(a, b)) <= 1
            time.sleep(0.05)
        # renewed since it was taken, and both candidates have read who holds it (the
        # follower learns that on its next read of the Lease)
        assert wait_for(lambda: renewed(fake) and
                        a.elector.leader() == b.elector.leader() == holder(fake))
        lease = fake.get("leases", NAME, NS)
        assert lease is not None
        spec = lease["spec"]
        assert [spec["holderIdentity"]] == leaders(a, b)
        assert spec["leaseDurationSeconds"] == STEADY.lease_duration_s
        assert spec["leaseTransitions"] == 0
        assert MICRO.match(spec["acquireTime"]) and MICRO.match(spec["renewTime"])
        assert spec["renewTime"] > spec["acquireTime"]  # renewed since
        assert a.elector.leader() == b.elector.leader() == spec["holderIdentity"]
    finally:
        a.halt()
        b.halt()
        a.api.close()
        b.api.close()


def holder(fake: FakeApiServer) -> str:
    return str(((fake.get("leases", NAME, NS) or {}).get("spec") or {}).get("holderIdentity"))


def renewed(fake: FakeApiServer) -> bool:
    spec = (fake.get("leases", NAME, NS) or {}).get("spec") or {}
    return bool(spec) and spec["renewTime"] > spec["acquireTime"]


def test_a_replica_that_stops_gives_the_lease_up_and_the_other_takes_over_at_once(
        fake: FakeApiServer) -> None:
    a = candidate(fake, "ctl-a_1")
    assert wait_for(a.elector.is_leader)
    b = candidate(fake, "ctl-b_2")
    try:
        assert wait_for(lambda: b.elector.leader() == "ctl-a_1")  # b follows a
        assert leaders(a, b) == ["ctl-a_1"]
        stopped = time.monotonic()
        a.halt()
        assert wait_for(b.elector.is_leader)
        # far sooner than the Lease would have expired (STEADY: 30 s)
        assert time.monotonic() - stopped < STEADY.lease_duration_s  # no wait for expiry
        spec = (fake.get("leases", NAME, NS) or {})["spec"]
        assert spec["holderIdentity"] == "ctl-b_2" and spec["leaseTransitions"] == 1
    finally:
        b.halt()
        a.api.close()
        b.api.close()


SLACK_S = 1.0
"""How late a loaded machine may notice what the clock already decided (a poll, a thread
scheduled late): a third of FAST's lease, so "within the lease" still means within it."""


def test_a_leader_cut_off_from_the_api_stops_and_the_other_takes_over_within_the_lease(
        fake: FakeApiServer) -> None:
    a = candidate(fake, "ctl-a_1", FAST)
    assert wait_for(a.elector.is_leader)
    b = candidate(fake, "ctl-b_2", FAST)
    try:
        assert wait_for(lambda: b.elector.leader() == "ctl-a_1")  # b follows a
        a.api.close()  # every call of a's fails from now on, as in a network partition
        cut = time.monotonic()
        assert wait_for(lambda: not a.elector.is_leader())
        a_stopped = time.monotonic()
        # b may take over a lease duration after its last sight of a renewal, a stops a
        # renew deadline after its last renewal: a full second before
        assert leaders(b) == []  # b has not taken over before a stopped
        assert wait_for(b.elector.is_leader)
        taken = time.monotonic()
        assert a_stopped - cut <= FAST.renew_deadline_s + SLACK_S
        # b waits out the lease from its last sight of a renewal (at most one retry before
        # the cut), then tries within a jittered retry period
        assert taken - cut <= FAST.lease_duration_s + FAST.retry_period_s * 2.2 + SLACK_S
        assert leaders(a, b) == ["ctl-b_2"]
        assert (fake.get("leases", NAME, NS) or {})["spec"]["leaseTransitions"] == 1
    finally:
        a.halt()
        b.halt()
        b.api.close()


def test_the_controller_reconciles_only_while_it_leads(fake: FakeApiServer) -> None:
    fake.seed("gpudevices", device("n1", 0))
    api = ControllerApi.open(server=fake.url)
    lease_api = KubeApi.connect(server=fake.url, timeout_s=FAST.retry_period_s)
    elector = LeaderElector(LeaseLock(lease_api, NS, NAME), "ctl-a_1", FAST)
    rounds: list[float] = []
    terms: list[threading.Event] = []
    stop, elector_stop = threading.Event(), threading.Event()

    def work(ended: threading.Event) -> None:
        terms.append(ended)
        Controller(api, verify=None).run(ended, 60.0, lambda _: rounds.append(time.monotonic()),
                                         1)

    threads = [threading.Thread(target=elector.run, args=(elector_stop,), daemon=True),
               threading.Thread(target=lead, args=(elector, stop, work), daemon=True)]
    for t in threads:
        t.start()
    try:
        assert wait_for(lambda: bool(rounds))  # leading: it reconciled
        assert fake.objects("resourceclasses")  # ... and wrote the default class
        lease_api.close()  # the lease can no longer be renewed
        assert wait_for(lambda: not elector.is_leader())
        assert wait_for(lambda: len(terms) == 1 and terms[0].is_set())  # the term ended
        so_far = len(rounds)
        fake.seed("gpudevices", device("n2", 0, "T4"))  # an event it would act on if leading
        time.sleep(2.0)
        # no round begins once the term ended (one in flight then may still finish)
        assert len(rounds) <= so_far + 1 and len(terms) == 1
        assert {c["metadata"]["name"] for c in fake.objects("resourceclasses")} == \
            {"a100-sxm4-80gb"}  # the T4's class was never made
    finally:
        stop.set()
        elector_stop.set()
        for t in threads:
            t.join(30)
        api.close()
