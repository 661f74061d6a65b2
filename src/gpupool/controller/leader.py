"""Leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's semantics.

Two parts:

* ``Election`` — the rules, pure: no I/O, no clock of its own. Given the Lease as just
  read and the time, it says what to write (``Create``, ``Update``) or to ``Wait``; it is
  told whether the write succeeded. Times come in as ``now_s`` (a monotonic clock, for
  every expiry decision) and ``wall`` (written into the Lease, for people).
* ``LeaderElector`` — runs an ``Election`` against a ``Lock`` (``gpupool.kube.lease``) in
  a thread: try every retry period (with jitter while following), keep track of terms,
  release the Lease on a clean stop.

The rules (client-go's ``tools/leaderelection``):

* A candidate takes the Lease when nobody holds it (no Lease, or an empty holder) or
  when the record has not changed for ``lease_duration_s`` *as measured on its own
  clock* since it first saw that record: the times written in the Lease are never
  compared with the local clock, so clock skew between replicas does not matter (only
  the rate at which clocks run).
* Taking over bumps ``leaseTransitions`` and sets ``acquireTime``; renewing keeps both
  and moves ``renewTime``.
* Every write carries the ``resourceVersion`` it read: of two candidates that saw the
  same expired Lease, one write wins and the other gets a conflict and keeps following.
* The leader renews every retry period; if no renewal has succeeded for
  ``renew_deadline_s`` it stops leading (before any other candidate may take over,
  ``lease_duration_s`` after the last renewal it saw). The deadline counts from when the
  successful write was *sent*, as client-go's does: the API server stores the record (and
  followers start counting) no earlier than that, however late its answer comes.
* On a clean stop the leader writes an empty holder with a one-second duration, so a
  follower takes over at once instead of waiting out the Lease.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from gpupool.kube.errors import KubeError
from gpupool.kube.lease import LeaseRecord, StoredLease

log = logging.getLogger(__name__)

JITTER = 1.2
"""A follower waits ``retry_period_s × (1 + random × JITTER)`` between tries (client-go's
factor); the renew deadline must exceed ``retry_period_s × JITTER``."""


@dataclass(frozen=True, slots=True)
class ElectionTiming:
    """client-go's defaults: a 15 s lease, a 10 s renew deadline, a 2 s retry period."""

    lease_duration_s: int = 15
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if self.lease_duration_s < 1 or self.renew_deadline_s <= 0 or self.retry_period_s <= 0:
            raise ValueError("lease duration, renew deadline and retry period must be positive "
                             "(the lease duration a whole number of seconds)")
        if self.lease_duration_s <= self.renew_deadline_s:
            raise ValueError(f"the lease duration ({self.lease_duration_s} s) must be longer "
                             f"than the renew deadline ({self.renew_deadline_s} s)")
        if self.renew_deadline_s <= JITTER * self.retry_period_s:
            raise ValueError(f"the renew deadline ({self.renew_deadline_s} s) must be longer "
                             f"than {JITTER} × the retry period ({self.retry_period_s} s)")
        margin_s = self.lease_duration_s - self.renew_deadline_s
        if self.retry_period_s >= margin_s:
            raise ValueError(f"the retry period ({self.retry_period_s} s) must be shorter than "
                             f"the lease duration minus the renew deadline ({margin_s:g} s): "
                             "Lease calls time out after one retry period, and the leader "
                             "must stop before a follower may take over")


@dataclass(frozen=True, slots=True)
class Create:
    """No Lease exists: create it holding ``record``."""

    record: LeaseRecord


@dataclass(frozen=True, slots=True)
class Update:
    """Write ``record`` over the Lease read at ``resource_version``."""

    record: LeaseRecord
    resource_version: str


@dataclass(frozen=True, slots=True)
class Wait:
    """Another candidate holds the Lease; it expires at ``expires_s`` (monotonic) unless
    it changes first."""

    holder: str
    expires_s: float


Step = Create | Update | Wait


class Election:
    """The state of one candidate: what it last saw of the Lease, when, and whether it
    leads. Not thread-safe (``LeaderElector`` holds it under its lock)."""

    def __init__(self, identity: str, timing: ElectionTiming):
        if not identity:
            raise ValueError("a candidate needs a non-empty identity")
        self.identity, self.timing = identity, timing
        self.observed: LeaseRecord | None = None
        self.observed_at_s = 0.0  # local time the observed record was first seen
        self.renewed_at_s: float | None = None  # local time the last successful write was sent
        self.sent_s: float | None = None  # local time the pending Create or Update was asked for
        self.resource_version: str | None = None  # of the Lease this candidate last wrote

    def next_step(self, now_s: float, wall: datetime, stored: StoredLease | None) -> Step:
        """What to do about the Lease as just read (None: it does not exist)."""
        mine = LeaseRecord(self.identity, self.timing.lease_duration_s, wall, wall, 0)
        self.sent_s = now_s
        if stored is None:
            return Create(mine)
        current = stored.record
        if current != self.observed:
            self.observed, self.observed_at_s = current, now_s
        expires_s = self.observed_at_s + current.lease_duration_s
        if current.holder and current.holder != self.identity and now_s < expires_s:
            return Wait(current.holder, expires_s)
        if current.holder == self.identity:
            record = LeaseRecord(self.identity, self.timing.lease_duration_s,
                                 current.acquire_time or wall, wall, current.transitions)
        else:
            record = LeaseRecord(self.identity, self.timing.lease_duration_s, wall, wall,
                                 current.transitions + 1)
        return Update(record, stored.resource_version)

    def written(self, now_s: float, stored: StoredLease, sent_s: float | None = None) -> None:
        """The write of ``next_step`` succeeded (answered at ``now_s``): this candidate holds
        the Lease. The renew deadline counts from ``sent_s``, when the write was sent (by
        default when ``next_step`` asked for it), never from the answer: the record may have
        been stored, and read by followers, long before the answer arrived."""
        self.observed, self.observed_at_s = stored.record, now_s
        sent_s = self.sent_s if sent_s is None else sent_s
        self.renewed_at_s = now_s if sent_s is None else min(now_s, sent_s)
        self.sent_s = None
        self.resource_version = stored.resource_version

    def waiting(self) -> None:
        """``next_step`` said ``Wait``: another candidate holds the Lease."""
        self.renewed_at_s = None

    def leads(self, now_s: float) -> bool:
        """Whether this candidate may act as leader now: it holds the Lease and its last
        renewal is less than the renew deadline ago."""
        return self.renewed_at_s is not None and \
            now_s - self.renewed_at_s < self.timing.renew_deadline_s

    @property
    def holder(self) -> str:
        """Who holds the Lease, as last seen ("" nobody, or not seen yet)."""
        return self.observed.holder if self.observed is not None else ""

    @property
    def transitions(self) -> int:
        return self.observed.transitions if self.observed is not None else 0

    def release(self, wall: datetime) -> LeaseRecord | None:
        """The record that gives the Lease up (None: this candidate does not hold it)."""
        if self.observed is None or self.observed.holder != self.identity:
            return None
        return LeaseRecord("", 1, wall, wall, self.observed.transitions)


# -- running it --------------------------------------------------------------------------------
class Lock(Protocol):
    """The Lease calls (``gpupool.kube.lease.LeaseLock``)."""

    def describe(self) -> str: ...
    def get(self) -> StoredLease | None: ...
    def create(self, record: LeaseRecord) -> StoredLease: ...
    def update(self, record: LeaseRecord, resource_version: str) -> StoredLease: ...


class Clock(Protocol):
    def monotonic(self) -> float: ...
    def wall(self) -> datetime: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> datetime:
        return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class Term:
    """One stretch of leadership: ``ended`` is set when it is lost or the elector stops."""

    number: int
    ended: threading.Event


class LeaderElector:
    """Tries the Lease every retry period in ``run`` and says who leads (thread-safe)."""

    def __init__(self, lock: Lock, identity: str, timing: ElectionTiming | None = None,
                 clock: Clock | None = None, rng: random.Random | None = None,
                 on_change: Callable[[LeaderElector], None] | None = None):
        """``on_change`` is called (on the elector's thread) after every try whose outcome
        changed who leads or whether this candidate does (metrics, logs)."""
        self.lock, self.identity = lock, identity
        self.timing = timing or ElectionTiming()
        self.clock = clock or SystemClock()
        self.rng = rng or random.Random()
        self.on_change = on_change
        self.election = Election(identity, self.timing)
        self._guard = threading.Lock()
        self._term: Term | None = None
        self._terms = 0
        self._changed = threading.Condition(self._guard)
        self.last_error = ""

    # -- what others ask -----------------------------------------------------------------------
    def is_leader(self) -> bool:
        with self._guard:
            return self.election.leads(self.clock.monotonic())

    def leader(self) -> str:
        """Who holds the Lease as last seen ("" when nobody does)."""
        with self._guard:
            return self.election.holder

    def transitions(self) -> int:
        with self._guard:
            return self.election.transitions

    def healthy(self, tolerance_s: float = 20.0) -> bool:
        """False only when this candidate held the Lease at its last successful write and has
        not renewed it for the lease duration plus ``tolerance_s`` (cut off from the API
        server, or its renew loop is stuck): a liveness probe then restarts it, as client-go's
        healthz adaptor does. A follower is always healthy."""
        with self._guard:
            renewed = self.election.renewed_at_s
            return renewed is None or self.clock.monotonic() - renewed <= \
                self.timing.lease_duration_s + tolerance_s

    def wait_for_term(self, stop: threading.Event, poll_s: float = 0.1) -> Term | None:
        """Block until this candidate leads (its current ``Term``) or ``stop`` is set (None)."""
        with self._changed:
            while not stop.is_set():
                term = self._term
                if term is not None and not term.ended.is_set():
                    return term
                self._changed.wait(poll_s)
        return None

    # -- the loop ------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Try the Lease until ``stop`` is set, then end the term and give the Lease up if
        this candidate holds it (the caller stops its leader's work before setting ``stop``)."""
        log.info("%s: candidate %s (lease %d s, renew deadline %.0f s, retry %.0f s)",
                 self.lock.describe(), self.identity, self.timing.lease_duration_s,
                 self.timing.renew_deadline_s, self.timing.retry_period_s)
        watchdog = threading.Thread(target=self._watch_deadline, args=(stop,),
                                    name="lease-deadline", daemon=True)
        watchdog.start()
        try:
            while not stop.is_set():
                self.step()
                stop.wait(self._pause())
        finally:
            self._end_term("stopping")
            watchdog.join(1.0)
            self.release()

    def _watch_deadline(self, stop: threading.Event) -> None:
        """End the term as soon as the renew deadline passes, even while a try is blocked on
        a slow API server."""
        period = min(0.1, self.timing.retry_period_s / 4)
        while not stop.wait(period):
            with self._guard:
                term = self._term
            if term is not None and not term.ended.is_set() and not self.is_leader():
                self._end_term(f"no renewal for {self.timing.renew_deadline_s:.0f} s "
                               f"({self.last_error or 'no answer'})")

    def _pause(self) -> float:
        with self._guard:
            renewed = self.election.renewed_at_s
            leading = self.election.leads(self.clock.monotonic())
        base = self.timing.retry_period_s
        if leading and renewed is not None:
            return base
        return base * (1.0 + self.rng.random() * JITTER)

    def step(self) -> None:
        """One try: read the Lease, write it if the rules say so, update the term."""
        before = (self.leader(), self.is_leader())
        try:
            self._try()
        except KubeError as exc:
            self.last_error = str(exc)
            log.warning("%s: %s", self.lock.describe(), exc)
        self._settle(before)

    def _try(self) -> None:
        sent_s = self.clock.monotonic()  # before the read: the deadline counts from here
        stored = self.lock.get()
        with self._guard:
            step = self.election.next_step(self.clock.monotonic(), self.clock.wall(), stored)
            if isinstance(step, Wait):
                self.election.waiting()
        if isinstance(step, Wait):
            return
        done = self.lock.create(step.record) if isinstance(step, Create) else \
            self.lock.update(step.record, step.resource_version)
        with self._guard:
            self.election.written(self.clock.monotonic(), done, sent_s)
        self.last_error = ""

    def _settle(self, before: tuple[str, bool]) -> None:
        leading = self.is_leader()
        with self._guard:
            idle = self._term is None or self._term.ended.is_set()
        if leading and idle:
            self._begin_term()
        elif not leading:
            self._end_term("lost the lease" if before[1] else "")
        if (self.leader(), leading) != before and self.on_change is not None:
            self.on_change(self)

    def _begin_term(self) -> None:
        with self._changed:
            self._terms += 1
            self._term = Term(self._terms, threading.Event())
            self._changed.notify_all()
        log.info("%s: %s leads (term %d, %d transitions)", self.lock.describe(),
                 self.identity, self._terms, self.transitions())

    def _end_term(self, why: str) -> None:
        with self._changed:
            term = self._term
            if term is None or term.ended.is_set():
                return
            term.ended.set()
            self._changed.notify_all()
        if why:
            log.warning("%s: %s stops leading: %s", self.lock.describe(), self.identity, why)

    def release(self) -> None:
        """Give the Lease up if this candidate holds it (an empty holder, a 1 s duration)."""
        with self._guard:
            record = self.election.release(self.clock.wall())
            version = self.election.resource_version
        if record is None or version is None:
            return
        try:
            stored = self.lock.update(record, version)
        except KubeError as exc:
            log.warning("%s: could not give the lease up: %s", self.lock.describe(), exc)
            return
        with self._guard:
            self.election.observed = stored.record
            self.election.renewed_at_s = None
        log.info("%s: %s gave the lease up", self.lock.describe(), self.identity)


def lead(elector: LeaderElector, stop: threading.Event,
         work: Callable[[threading.Event], None]) -> None:
    """Run ``work(ended)`` for every term this candidate leads, until ``stop`` is set.
    ``ended`` is set when the term ends (the lease is lost, or its renew deadline passed)
    or ``stop`` is set; ``work`` must return soon after. Followers only wait here."""
    while not stop.is_set():
        term = elector.wait_for_term(stop)
        if term is None:
            return
        relay = threading.Thread(target=_relay, args=(stop, term.ended), daemon=True,
                                 name=f"term-{term.number}")
        relay.start()
        work(term.ended)
        relay.join(1.0)


def _relay(stop: threading.Event, ended: threading.Event) -> None:
    while not ended.wait(0.1):
        if stop.is_set():
            ended.set()
