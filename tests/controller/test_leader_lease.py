"""Two controller replicas elect a leader through a Lease on the FAKE API server (real
HTTP, real lightkube): exactly one leads, the other takes over when it stops or is cut
off, and a leader that cannot renew stops reconciling.

Threads and a real HTTP server on a machine that may be loaded: a Lease call may take longer
than a retry period, so a short renew deadline could end a term the test did not mean to
end. Tests that do not wait out a Lease use STEADY (a renew
deadline no loaded machine reaches); the one that must wait one out uses FAST. The exact
timing rules are checked on a fake clock in tests/controller/test_leader.py; here the order
of events is, read from what each candidate read and wrote (a busy machine only spreads
them out), with generous waits that only guard against a hang."""

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
from gpupool.kube.lease import LeaseLock, LeaseRecord, StoredLease
from tests.controller.builders import device
from tests.waiting import wait_for

NS, NAME = "gpupool-system", "gpupool-controller"
FAST = ElectionTiming(lease_duration_s=3, renew_deadline_s=2, retry_period_s=0.5)
STEADY = ElectionTiming(lease_duration_s=30, renew_deadline_s=20, retry_period_s=0.25)
MICRO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
CALL_TIMEOUT_S = 10.0
"""How long a candidate's Lease call may take. The controller gives its calls one retry
period, so that a leader cut off by a network notices soon; here a cut is a closed
``KubeApi`` (its calls fail at once), and a call slowed by a busy machine must not fail:
a lost release would leave the other candidate waiting out a STEADY Lease."""


@dataclass(frozen=True)
class Write:
    """A write of the Lease that succeeded: when it was sent (the electors' monotonic
    clock), what it wrote, and what its candidate had read just before."""

    sent_s: float
    record: LeaseRecord
    read: LeaseRecord | None


class RecordedLock:
    """The real ``LeaseLock``, noting each write that succeeded (a recorder, not a fake:
    every call goes to the API server)."""

    def __init__(self, lock: LeaseLock):
        self.lock = lock
        self.writes: list[Write] = []
        self._read: LeaseRecord | None = None

    def describe(self) -> str:
        return self.lock.describe()

    def get(self) -> StoredLease | None:
        stored = self.lock.get()
        self._read = stored.record if stored is not None else None
        return stored

    def create(self, record: LeaseRecord) -> StoredLease:
        sent_s, read = time.monotonic(), self._read
        stored = self.lock.create(record)
        self.writes.append(Write(sent_s, record, read))
        return stored

    def update(self, record: LeaseRecord, resource_version: str) -> StoredLease:
        sent_s, read = time.monotonic(), self._read
        stored = self.lock.update(record, resource_version)
        self.writes.append(Write(sent_s, record, read))
        return stored


@dataclass
class Candidate:
    api: KubeApi
    lock: RecordedLock
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
    api = KubeApi.connect(server=fake.url, timeout_s=CALL_TIMEOUT_S)
    lock = RecordedLock(LeaseLock(api, NS, NAME))
    elector = LeaderElector(lock, who, timing)
    stop = threading.Event()
    thread = threading.Thread(target=elector.run, args=(stop,), daemon=True)
    thread.start()
    return Candidate(api, lock, elector, stop, thread)


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
        a.halt()
        assert wait_for(b.elector.is_leader)
        # a gave the Lease up on its way out, and b took it because nobody held it: b did
        # not wait out a's Lease (STEADY: 30 s)
        assert a.lock.writes[-1].record.holder == ""
        taken = b.lock.writes[0]
        assert taken.record.holder == "ctl-b_2" and taken.read is not None
        assert taken.read.holder == ""
        spec = (fake.get("leases", NAME, NS) or {})["spec"]
        assert spec["holderIdentity"] == "ctl-b_2" and spec["leaseTransitions"] == 1
    finally:
        b.halt()
        a.api.close()
        b.api.close()


def test_a_leader_cut_off_from_the_api_stops_and_the_other_takes_over_once_the_lease_expired(
        fake: FakeApiServer) -> None:
    a = candidate(fake, "ctl-a_1", FAST)
    assert wait_for(a.elector.is_leader)
    b = candidate(fake, "ctl-b_2", FAST)
    try:
        assert wait_for(lambda: b.elector.leader() == "ctl-a_1")  # b follows a
        a.api.close()  # every call of a's fails from now on, as in a network partition
        assert wait_for(lambda: not a.elector.is_leader())
        assert wait_for(b.elector.is_leader)
        renewed = a.lock.writes[-1]  # a's last renewal: no write of a's succeeds after the cut
        taken = b.lock.writes[0]  # b wrote nothing before it took over
        # b took over a Lease a still held on record, a full lease duration after a's
        # last renewal, however late a loaded machine ran either thread
        assert renewed.record.holder == "ctl-a_1"
        assert taken.record.holder == "ctl-b_2" and taken.read is not None
        assert taken.read.holder == "ctl-a_1"  # (a write in flight at the cut may be on it)
        assert taken.sent_s - renewed.sent_s >= FAST.lease_duration_s
        # a had stopped leading by then: its renew deadline passed before b's takeover
        assert not a.elector.election.leads(taken.sent_s)
        assert leaders(a, b) == ["ctl-b_2"]
        assert (fake.get("leases", NAME, NS) or {})["spec"]["leaseTransitions"] == 1
    finally:
        a.halt()
        b.halt()
        b.api.close()


def test_the_controller_reconciles_only_while_it_leads(fake: FakeApiServer) -> None:
    fake.seed("gpudevices", device("n1", 0))
    api = ControllerApi.open(server=fake.url)
    lease_api = KubeApi.connect(server=fake.url, timeout_s=CALL_TIMEOUT_S)
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
        # the term ended (a busy machine may have ended an earlier one too, FAST's renew
        # deadline being short)
        assert wait_for(lambda: bool(terms) and all(t.is_set() for t in terms))
        so_far, terms_so_far = len(rounds), len(terms)
        fake.seed("gpudevices", device("n2", 0, "T4"))  # an event it would act on if leading
        time.sleep(2.0)
        # no round begins once the term ended (one in flight then may still finish)
        assert len(rounds) <= so_far + 1 and len(terms) == terms_so_far  # and none begins
        assert {c["metadata"]["name"] for c in fake.objects("resourceclasses")} == \
            {"a100-sxm4-80gb"}  # the T4's class was never made
    finally:
        stop.set()
        elector_stop.set()
        for t in threads:
            t.join(30)
        api.close()
