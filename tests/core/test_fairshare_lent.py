"""What a cohort lends when lenders' own pods wait: a lender's waiting pods within its
nominal take their part of its idle quota back first, so the cohort divides less among the
borrowers (worked examples), and on random cohorts it is what the cohort would lend were
the waiting pods running, never more than it lends now nor than the lending limits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.cohort import DIMS, CohortMember, CohortState
from gpupool.core.quota import Amount, Limit
from gpupool.core.tenantshare import beyond_fair_share, entitlements, lent

from .test_cohort_properties import asks, members, replay
from .test_tenantshare_properties import waiting_of


def lab(lending: int | None = None) -> CohortState:
    """Lender ``a`` (nominal 4, idle); borrowers ``b`` and ``c`` (nominal 0, 2 GPUs each)."""
    ms = [CohortMember("a", Limit(gpus=4), "lab",
                       lending_limit=None if lending is None else Limit(gpus=lending)),
          CohortMember("b", Limit(gpus=0), "lab"), CohortMember("c", Limit(gpus=0), "lab")]
    return CohortState.of(ms, {"b": Amount(gpus=1), "c": Amount(gpus=1)})


CASES = [
    ("nothing of the lender waits: the cohort lends its idle 4", None, 0, 4, (2, 2)),
    ("2 of the lender's pods wait: it lends the other 2", None, 2, 2, (1, 1)),
    ("its waiting pods fill its nominal: it lends nothing", None, 6, 0, (0, 0)),
    ("a lending limit of 3 and 2 waiting: the guaranteed 1 takes one back first", 3, 2, 2,
     (1, 1)),
    ("a lending limit of 1 and 2 waiting: the guaranteed 3 hold both", 1, 2, 1, (1, 0)),
]


@pytest.mark.parametrize(("lending", "waits", "lends", "shares"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_a_lenders_waiting_pods_lower_what_the_cohort_divides(
        lending: int | None, waits: int, lends: int, shares: tuple[int, int]) -> None:
    state = lab(lending)
    waiting = {"a": Amount(gpus=waits), "b": Amount(gpus=4), "c": Amount(gpus=4)}
    assert lent(state, "b", waiting).gpus == lends
    got = entitlements(state, "lab", waiting)
    assert (got["b"].share.gpus, got["c"].share.gpus) == shares


def test_a_borrow_the_lenders_waiting_pods_will_take_back_is_refused_for_fairness() -> None:
    state = lab()
    asked = Amount(gpus=1)  # b would borrow 2; the cohort lends 4 to b and c alike
    assert beyond_fair_share(state, "b", asked, {"c": Amount(gpus=4)}) is None
    found = beyond_fair_share(state, "b", asked, {"a": Amount(gpus=2), "c": Amount(gpus=4)})
    assert found is not None and (found.borrowed, found.share) == (1, 1)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_what_is_lent_is_what_the_cohort_would_lend_were_the_waiting_pods_running(
        data: st.DataObject) -> None:
    ms = data.draw(members())
    state, _ = replay(ms, data.draw(asks(len(ms))))
    waiting = waiting_of(data.draw, [m.name for m in ms])
    more = waiting_of(data.draw, [m.name for m in ms])
    running = state
    for name, amount in waiting.items():
        running = running.charged(name, amount)
    for m in ms:
        now, then = state.borrowable(m.name), lent(state, m.name, waiting)
        assert then == running.borrowable(m.name)
        assert lent(state, m.name, {}) == now
        worse = lent(state, m.name, {n: waiting.get(n, Amount()) + more.get(n, Amount())
                                     for n in {*waiting, *more}})
        cap = {d: sum(min(p.lendable(d), p.nominal_of(d) or 0) for p in state.peers(m.name))
               for d in DIMS}
        for d in DIMS:
            assert getattr(worse, d) <= getattr(then, d) <= getattr(now, d) <= cap[d]
