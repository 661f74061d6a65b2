"""The fair share a cohort member is entitled to now (what the controller writes into
TenantQuota status and exports as metrics): worked examples, and on random cohorts the
same division ``beyond_fair_share`` enforces, never more than the cohort lends, and a
ratio above 1 exactly where a member borrows beyond its share."""

from __future__ import annotations

from math import inf

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.cohort import DIMS, CohortMember, CohortState
from gpupool.core.quota import Amount, Limit
from gpupool.core.tenantshare import divided, entitlements, lent, wants

from .test_cohort_properties import asks, members, replay
from .test_tenantshare_properties import waiting_of


def cohort(*spec: tuple[str, int, int, int]) -> CohortState:
    """(name, nominal GPUs, used GPUs, weight) per member of cohort ``lab``."""
    ms = [CohortMember(n, Limit(gpus=g), "lab", weight=w) for n, g, _, w in spec]
    return CohortState.of(ms, {n: Amount(gpus=u) for n, _, u, _ in spec})


CASES = [
    # id, members, waiting GPUs by member, expected (share, entitled, ratio) by member
    ("two borrowers of weights 1 and 3 split the 4 GPUs the idle lender lends",
     [("a", 4, 0, 1), ("b", 2, 2, 1), ("c", 2, 2, 3)], {"b": 4, "c": 4},
     {"a": (0, 4, 0.0), "b": (1, 3, 2 / 3), "c": (3, 5, 2 / 5)}),
    ("a lone borrower is entitled to all the cohort lends (work-conserving)",
     [("a", 4, 0, 1), ("b", 2, 6, 1)], {"b": 1},
     {"a": (0, 4, 0.0), "b": (4, 6, 1.0)}),
    ("a member holding its share while another waits is over it",
     [("a", 4, 0, 1), ("b", 2, 6, 1), ("c", 2, 2, 1)], {"c": 4},
     {"a": (0, 4, 0.0), "b": (2, 4, 1.5), "c": (2, 4, 0.5)}),
    ("nothing waits and nobody borrows: every share is 0, entitled = nominal",
     [("a", 4, 1, 1), ("b", 2, 2, 1)], {},
     {"a": (0, 4, 0.25), "b": (0, 2, 1.0)}),
    ("a member of no nominal holding what it is entitled to none of",
     [("a", 2, 2, 1), ("b", 0, 0, 0), ("z", 0, 1, 0)], {"a": 0},
     {"a": (0, 2, 1.0), "b": (0, 0, 0.0), "z": (0, 0, inf)}),
]


@pytest.mark.parametrize(("spec", "waiting", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_a_members_fair_share_is_its_weighted_part_of_what_the_cohort_lends(
        spec: list[tuple[str, int, int, int]], waiting: dict[str, int],
        expected: dict[str, tuple[int, int, float]]) -> None:
    state = cohort(*spec)
    got = entitlements(state, "lab", {n: Amount(gpus=g) for n, g in waiting.items()})
    assert {n: (e.share.gpus, e.entitled.gpus) for n, e in got.items()} \
        == {n: x[:2] for n, x in expected.items()}
    assert {n: e.ratio("gpus") for n, e in got.items()} \
        == pytest.approx({n: x[2] for n, x in expected.items()})
    for e in got.values():
        assert (e.beyond == ("gpus",)) == ((e.ratio("gpus") or 0) > 1)
        assert e.ratio("memory_mib") is None  # not counted by the nominal
        assert e.dominant == ("gpus", e.ratio("gpus"))


def test_a_cohort_with_no_members_has_no_entitlements() -> None:
    assert entitlements(cohort(("a", 1, 0, 1)), "elsewhere", {}) == {}


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_entitlements_are_the_enforced_division_within_what_the_cohort_lends(
        data: st.DataObject) -> None:
    ms = data.draw(members())
    state, _ = replay(ms, data.draw(asks(len(ms))))
    waiting = waiting_of(data.draw, [m.name for m in ms])
    inside = [m for m in ms if m.cohort == "research"]
    got = entitlements(state, "research", waiting)
    assert set(got) == {m.name for m in inside}
    if not inside:
        return
    enforced = divided(state, inside[0].name, wants(state, inside[0].name, Amount(), waiting),
                       waiting)
    lends = lent(state, inside[0].name, waiting)
    for d in DIMS:
        assert sum(getattr(e.share, d) for e in got.values()) <= getattr(lends, d)
    for m in inside:
        e = got[m.name]
        assert e.share == enforced[m.name]
        for d in DIMS:
            nominal, ratio = m.nominal_of(d), e.ratio(d)
            if nominal is None:
                assert getattr(e.entitled, d) is None and ratio is None
                continue
            limit = m.may_borrow(d)
            assert getattr(e.share, d) <= getattr(e.wanted, d)
            assert limit is None or getattr(e.share, d) <= limit
            assert getattr(e.entitled, d) == nominal + getattr(e.share, d)
            assert ratio is not None and (ratio > 1) == (d in e.beyond)
