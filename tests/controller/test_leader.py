"""Leader election rules on a fake clock: when a candidate takes, renews, waits for and
gives up the Lease, and two candidates stepping against one in-memory Lease."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from gpupool.controller.leader import (
    Create,
    Election,
    ElectionTiming,
    LeaderElector,
    Update,
    Wait,
)
from gpupool.kube.errors import AlreadyExists, Conflict, KubeError
from gpupool.kube.lease import LeaseRecord, StoredLease

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
TIMING = ElectionTiming()  # 15 s lease, 10 s renew deadline, 2 s retry


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def monotonic(self) -> float:
        return self.now_s

    def wall(self) -> datetime:
        return T0 + timedelta(seconds=self.now_s - 1000.0)


class MemoryLock:
    """One Lease in memory with the API server's resourceVersion rules."""

    def __init__(self) -> None:
        self.stored: StoredLease | None = None
        self.version = 0
        self.down: set[str] = set()  # identities whose calls fail (cut off from the API)
        self.writes: list[LeaseRecord] = []

    def for_(self, who: str) -> MemoryLock:
        view = _View(self, who)
        return view  # type: ignore[return-value]

    def put(self, record: LeaseRecord) -> StoredLease:
        self.version += 1
        self.stored = StoredLease(record, str(self.version))
        self.writes.append(record)
        return self.stored


class _View:
    def __init__(self, lock: MemoryLock, who: str):
        self.lock, self.who = lock, who

    def describe(self) -> str:
        return "Lease test/lock"

    def _reachable(self) -> None:
        if self.who in self.lock.down:
            raise KubeError("connection refused")

    def get(self) -> StoredLease | None:
        self._reachable()
        return self.lock.stored

    def create(self, record: LeaseRecord) -> StoredLease:
        self._reachable()
        if self.lock.stored is not None:
            raise AlreadyExists("exists", 409, "AlreadyExists")
        return self.lock.put(record)

    def update(self, record: LeaseRecord, resource_version: str) -> StoredLease:
        self._reachable()
        if self.lock.stored is None or self.lock.stored.resource_version != resource_version:
            raise Conflict("modified", 409, "Conflict")
        return self.lock.put(record)


def held(holder: str, transitions: int = 0, rv: str = "7", renew: datetime = T0
         ) -> StoredLease:
    return StoredLease(LeaseRecord(holder, 15, T0, renew, transitions), rv)


# -- the rules -----------------------------------------------------------------------------------
def test_a_candidate_creates_a_missing_lease_holding_it_with_the_configured_duration() -> None:
    step = Election("a", TIMING).next_step(0.0, T0, None)
    assert step == Create(LeaseRecord("a", 15, T0, T0, 0))


def test_a_lease_held_by_another_is_waited_for_a_full_lease_duration_on_the_local_clock(
        ) -> None:
    e = Election("b", TIMING)
    assert e.next_step(100.0, T0, held("a", transitions=3)) == Wait("a", 115.0)
    assert isinstance(e.next_step(114.9, T0, held("a", transitions=3)), Wait)
    later = T0 + timedelta(seconds=15)
    assert e.next_step(115.0, later, held("a", transitions=3)) == \
        Update(LeaseRecord("b", 15, later, later, 4), "7")


def test_a_holder_that_keeps_renewing_is_never_taken_over() -> None:
    e = Election("b", TIMING)
    for k in range(20):  # the record changes every 2 s: each change restarts the wait
        renewed = T0 + timedelta(seconds=2 * k)
        assert isinstance(e.next_step(100.0 + 2 * k, T0, held("a", renew=renewed,
                                                                  rv=str(k))), Wait)


def test_times_written_in_the_lease_are_not_compared_with_the_local_clock() -> None:
    years_ago = T0 - timedelta(days=900)  # another replica's clock, badly skewed
    e = Election("b", TIMING)
    assert isinstance(e.next_step(5.0, T0, held("a", renew=years_ago)), Wait)


def test_an_empty_holder_is_taken_at_once_and_counts_as_a_transition() -> None:
    e = Election("b", TIMING)
    step = e.next_step(0.0, T0, held("", transitions=2))
    assert isinstance(step, Update) and step.record.holder == "b"
    assert step.record.transitions == 3


def test_the_holder_renews_keeping_its_acquire_time_and_the_transition_count() -> None:
    e = Election("a", TIMING)
    later = T0 + timedelta(seconds=4)
    step = e.next_step(4.0, later, held("a", transitions=5))
    assert step == Update(LeaseRecord("a", 15, T0, later, 5), "7")


def test_a_leader_stops_leading_when_no_renewal_succeeded_for_the_renew_deadline() -> None:
    e = Election("a", TIMING)
    e.written(50.0, held("a"))
    assert e.leads(50.0) and e.leads(59.9)
    assert not e.leads(60.0)
    e.written(61.0, held("a"))
    assert e.leads(61.0)
    e.waiting()  # another holder was seen
    assert not e.leads(61.0)


def test_giving_up_writes_an_empty_holder_with_a_one_second_lease() -> None:
    e = Election("a", TIMING)
    assert e.release(T0) is None  # holds nothing
    e.written(0.0, held("a", transitions=4))
    assert e.release(T0) == LeaseRecord("", 1, T0, T0, 4)


@pytest.mark.parametrize(("lease", "renew", "retry"), [(10, 10.0, 2.0), (15, 2.4, 2.0),
                                                       (0, 0.5, 0.1), (15, 10.0, 0.0),
                                                       (30, 25.0, 20.0), (15, 13.0, 2.0)])
def test_timings_client_go_refuses_are_refused(lease: int, renew: float, retry: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        ElectionTiming(lease, renew, retry)


# -- two candidates, one lease, a fake clock ------------------------------------------------------
def _pair() -> tuple[FakeClock, MemoryLock, LeaderElector, LeaderElector]:
    clock, lock = FakeClock(), MemoryLock()
    a = LeaderElector(lock.for_("a"), "a", TIMING, clock, random.Random(1))
    b = LeaderElector(lock.for_("b"), "b", TIMING, clock, random.Random(2))
    return clock, lock, a, b


def _tick(clock: FakeClock, *electors: LeaderElector, seconds: float = 0.5) -> None:
    for e in electors:
        e.step()
    clock.now_s += seconds


def test_of_two_candidates_exactly_one_leads_at_every_moment() -> None:
    clock, lock, a, b = _pair()
    for _ in range(200):
        _tick(clock, a, b)
        assert [a.is_leader(), b.is_leader()].count(True) == 1
    assert lock.stored is not None and lock.stored.record.holder == "a"
    assert lock.stored.record.transitions == 0
    assert a.leader() == b.leader() == "a"


def test_a_follower_takes_over_a_lease_duration_after_the_leader_is_cut_off() -> None:
    clock, lock, a, b = _pair()
    _tick(clock, a, b)
    assert a.is_leader()
    lock.down.add("a")
    cut_at = clock.now_s - 0.5  # a's last renewal, seen by b at once
    a_stopped = b_started = None
    while b_started is None:
        _tick(clock, a, b, seconds=0.1)
        if a_stopped is None and not a.is_leader():
            a_stopped = clock.now_s
        if b.is_leader():
            b_started = clock.now_s
    assert a_stopped is not None and a_stopped - cut_at <= TIMING.renew_deadline_s + 0.2
    assert a_stopped < b_started  # never two leaders
    assert TIMING.lease_duration_s <= b_started - cut_at <= TIMING.lease_duration_s + 1.0
    assert lock.stored is not None and lock.stored.record.transitions == 1
    assert lock.stored.record.acquire_time == clock.wall() - timedelta(seconds=0.1)


def test_a_released_lease_is_taken_by_the_follower_on_its_next_try() -> None:
    clock, lock, a, b = _pair()
    _tick(clock, a, b)
    a.release()
    assert lock.stored is not None and lock.stored.record == \
        LeaseRecord("", 1, clock.wall(), clock.wall(), 0)
    assert not a.is_leader()
    _tick(clock, b)
    assert b.is_leader() and lock.stored.record.holder == "b"


def test_a_candidate_that_loses_the_write_race_keeps_following() -> None:
    _, lock, a, b = _pair()
    lock.put(LeaseRecord("", 1, T0, T0, 0))
    stored = lock.stored
    assert stored is not None
    # both read the free lease; a writes first, b's write carries the old resourceVersion
    a.step()
    lock_view = b.lock
    b.lock = _Stale(lock_view, stored)  # type: ignore[assignment]
    b.step()
    assert a.is_leader() and not b.is_leader()
    assert "modified" in b.last_error


class _Stale:
    """b's view: it reads the lease as it was before a's write."""

    def __init__(self, view: _View, seen: StoredLease):
        self.view, self.seen = view, seen

    def describe(self) -> str:
        return self.view.describe()

    def get(self) -> StoredLease | None:
        return self.seen

    def create(self, record: LeaseRecord) -> StoredLease:
        return self.view.create(record)

    def update(self, record: LeaseRecord, resource_version: str) -> StoredLease:
        return self.view.update(record, resource_version)


def test_healthz_fails_only_for_a_leader_whose_renewals_stopped_long_ago() -> None:
    clock, _, a, b = _pair()
    _tick(clock, a, b)
    assert a.healthy() and b.healthy()
    clock.now_s += 15 + 21  # a's renew loop is stuck: neither stepped
    assert not a.healthy()
    assert b.healthy()  # a follower is always fine


def test_timings_whose_retry_period_eats_the_takeover_margin_are_refused() -> None:
    # Lease calls time out after one retry period: it must fit in lease - renew deadline
    with pytest.raises(ValueError, match=r"retry period \(5.0 s\) must be shorter .* \(5 s\)"):
        ElectionTiming(15, 10.0, 5.0)
    assert ElectionTiming(15, 10.0, 4.9).retry_period_s == 4.9


class _LateAnswers(_View):
    """The API server stores a's write at once, ``other`` reads it 0.1 s later, and the
    answer reaches a only ``late_s`` after the write."""

    def __init__(self, lock: MemoryLock, who: str, clock: FakeClock, late_s: float,
                 other: LeaderElector):
        super().__init__(lock, who)
        self.clock, self.late_s, self.other = clock, late_s, other

    def update(self, record: LeaseRecord, resource_version: str) -> StoredLease:
        stored = super().update(record, resource_version)
        self.clock.now_s += 0.1
        self.other.step()
        self.clock.now_s += self.late_s - 0.1
        return stored


def test_a_renewal_answered_late_counts_its_deadline_from_when_it_was_sent() -> None:
    clock, lock, a, b = _pair()
    _tick(clock, a, b)
    assert a.is_leader()
    a.lock = _LateAnswers(lock, "a", clock, 6.0, b)  # type: ignore[assignment]
    sent_at = clock.now_s
    a.step()  # stored at sent_at, answered at sent_at + 6
    lock.down.add("a")  # and then a is cut off
    both = []
    while not b.is_leader():
        _tick(clock, a, b, seconds=0.1)
        both.append(a.is_leader() and b.is_leader())
    assert not any(both)
    assert clock.now_s - sent_at >= TIMING.lease_duration_s  # b waited out the lease
    assert a.election.renewed_at_s == sent_at
