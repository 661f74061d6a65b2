"""Cohort properties on random cohorts and random sequences of requests: never over nominal +
borrowing limit, never lending more than the lending limits allow (a member's guaranteed part
is always there for it), reclaim restores the lender's nominal whenever the borrowed pods
suffice, the borrowed pods are exactly what runs beyond the nominal, and fair shares are
monotone in weight, within the wants and within the capacity."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.allocation import Allocation
from gpupool.core.cohort import (
    DIMS,
    CohortMember,
    CohortState,
    Verdict,
    admit,
    borrowed_keys,
    reclaim,
    weighted_max_min,
)
from gpupool.core.quota import Amount, Charge, Limit
from gpupool.core.victims import Candidate

from .builders import cluster, node

CLUSTER = cluster(node("n", gpus=8))
NAMES = ("team-a", "team-b", "team-c", "team-d")


def limit(draw: st.DrawFn, high: int, none: bool = True) -> Limit:
    value = st.none() | st.integers(0, high) if none else st.integers(0, high)
    return Limit(gpus=draw(value), core_pct=draw(value))


@st.composite
def members(draw: st.DrawFn) -> list[CohortMember]:
    count = draw(st.integers(2, 4))
    out = []
    for name in NAMES[:count]:
        nominal = Limit(gpus=draw(st.integers(0, 6)), core_pct=draw(st.integers(0, 600)))
        cohort = draw(st.sampled_from(["research", "research", None]))
        borrow = limit(draw, 6) if draw(st.booleans()) else None
        lend = limit(draw, 6) if draw(st.booleans()) else None
        out.append(CohortMember(name, nominal, cohort, borrow, lend,
                                draw(st.integers(0, 4))))
    return out


def asks(count: int) -> st.SearchStrategy[list[tuple[int, Amount]]]:
    amount = st.builds(lambda g, c: Amount(g, 0, c), st.integers(0, 3), st.integers(0, 300))
    return st.lists(st.tuples(st.integers(0, count - 1), amount), max_size=25)


def pod(k: int, name: str, amount: Amount, priority: int) -> Candidate:
    return Candidate(Allocation(f"p{k}", "n", 0, 0), priority, Charge(amount, group=name),
                     started_s=float(k))


def replay(ms: list[CohortMember], steps: list[tuple[int, Amount]]
           ) -> tuple[CohortState, list[Candidate]]:
    """Charge every admitted request (as a pod started at its step)."""
    s, pods = CohortState.of(ms), []
    for k, (i, amount) in enumerate(steps):
        name = ms[i % len(ms)].name
        if admit(s, name, amount).admitted:
            s = s.charged(name, amount)
            pods.append(pod(k, name, amount, k % 3))
    return s, pods


def get(a: Amount, d: str) -> int:
    value: int = getattr(a, d)
    return value


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_admitted_usage_stays_within_nominal_plus_borrowing_and_lending_limits(
        data: st.DataObject) -> None:
    ms = data.draw(members())
    s, _ = replay(ms, data.draw(asks(len(ms))))
    for m in ms:
        for d in DIMS:
            n, extra = m.nominal_of(d), m.may_borrow(d)
            if n is not None and extra is not None:
                assert get(s.used_by(m.name), d) <= n + extra
    for cohort in {m.cohort for m in ms if m.cohort is not None}:
        peers = [m for m in ms if m.cohort == cohort]
        for d in DIMS:  # all that is borrowed was lent, within the lending limits
            borrowed = sum(get(s.borrowed(m.name), d) for m in peers)
            assert borrowed <= get(s.borrowable(peers[0].name), d)
            capacity, drawn = s.pool(peers[0].name, d)
            assert drawn <= capacity


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_a_members_guaranteed_part_is_never_lent(data: st.DataObject) -> None:
    ms = data.draw(members())
    s, _ = replay(ms, data.draw(asks(len(ms))))
    for m in ms:
        room = {d: m.guaranteed(d) - get(s.used_by(m.name), d) for d in DIMS
                if m.nominal_of(d) is not None}
        if room and all(r > 0 for r in room.values()):
            got = admit(s, m.name, Amount(**{d: r for d, r in room.items()}))
            assert got.verdict is Verdict.FITS, got.reason


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_reclaim_restores_the_lenders_nominal(data: st.DataObject) -> None:
    ms = data.draw(members())
    s, pods = replay(ms, data.draw(asks(len(ms))))
    for m in ms:
        u = s.used_by(m.name)
        room = {d: (m.nominal_of(d) or 0) - get(u, d) for d in DIMS}
        if any(r < 0 for r in room.values()):
            continue
        asked = Amount(**room)
        got = admit(s, m.name, asked)
        assert got.verdict is not Verdict.REFUSED, got.reason  # its nominal is its own
        if got.verdict is not Verdict.RECLAIMS:
            continue
        plan = reclaim(s, m.name, got.reclaim, pods, CLUSTER)
        assert plan.restored, plan.reason  # the borrowed pods always suffice
        after = s
        borrowed = borrowed_keys(s, pods)
        for c in plan.victims:
            assert c.key in borrowed and c.charge is not None and c.charge.group != m.name
            after = after.refunded(c.charge.group or "", c.charge.amount)
        assert admit(after, m.name, asked).admitted


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_the_borrowed_pods_are_what_runs_beyond_the_nominal(data: st.DataObject) -> None:
    ms = data.draw(members())
    s, pods = replay(ms, data.draw(asks(len(ms))))
    borrowed = borrowed_keys(s, pods)
    for m in ms:
        mine = [c for c in pods if c.charge is not None and c.charge.group == m.name]
        kept = Amount()
        on_loan = Amount()
        for c in mine:
            assert c.charge is not None
            if c.key in borrowed:
                on_loan = on_loan + c.charge.amount
            else:
                kept = kept + c.charge.amount
                assert all(c.started_s < b.started_s for b in mine if b.key in borrowed)
        for d in DIMS:
            n = m.nominal_of(d)
            if n is not None:
                assert get(kept, d) <= n
                assert get(on_loan, d) >= get(s.borrowed(m.name), d)


wants_st = st.dictionaries(st.sampled_from(NAMES), st.integers(0, 40), min_size=1)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 60), wants_st, st.data())
def test_fair_shares_are_monotone_in_weight_and_within_capacity(
        capacity: int, wants: dict[str, int], data: st.DataObject) -> None:
    weights = {g: data.draw(st.sampled_from([0, 0.5, 1, 2, 3, 7])) for g in wants}
    shares = weighted_max_min(capacity, wants, weights)
    assert sum(shares.values()) == min(capacity, sum(wants.values()))  # work-conserving
    assert all(0 <= shares[g] <= wants[g] for g in wants)
    g = data.draw(st.sampled_from(sorted(wants)))
    heavier = {**weights, g: weights[g] + data.draw(st.sampled_from([0.5, 1, 4]))}
    assert weighted_max_min(capacity, wants, heavier)[g] >= shares[g]
