"""Review: leader election must never let two candidates lead at once.

The renew deadline must count from when the write was *sent*, not from when its answer
arrived (as it once did). The API server may have stored (and other candidates may have read) the
record long before that answer came back (a slow or congested API server). Followers
count the lease duration from when they first saw the record; a leader that counted its
renew deadline from when it heard back would be late. When the answer is late by more than
``lease_duration_s - renew_deadline_s`` (5 s with client-go's defaults), the old leader
would still believe it leads after a follower has rightly taken the Lease over.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpupool.controller.leader import Election, ElectionTiming, Update, Wait
from gpupool.kube.lease import StoredLease

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def wall(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def test_a_late_answer_to_a_renewal_never_leaves_two_leaders() -> None:
    timing = ElectionTiming()  # 15 s lease, 10 s renew deadline, 2 s retry
    a, b = Election("a", timing), Election("b", timing)
    # a sends its write at t=0; the API server stores it at once (resourceVersion 2) ...
    step = a.next_step(0.0, wall(0.0), None)
    stored = StoredLease(step.record, "2")
    # ... b reads the stored record at t=0.1 and starts counting the lease from then ...
    assert isinstance(b.next_step(0.1, wall(0.1), stored), Wait)
    # ... and a hears back only at t=6 (a slow API server); its later renewals all fail.
    a.written(6.0, stored)
    # b sees no change for 15 s of its own clock and takes the Lease over, correctly.
    take = b.next_step(15.2, wall(15.2), stored)
    assert isinstance(take, Update)
    b.written(15.3, StoredLease(take.record, "3"))
    # At t=15.5 both believe they lead.
    assert not (a.leads(15.5) and b.leads(15.5))
