"""Fair share in a running cohort on random cohorts: the cheap sufficient condition never
admits what the division would refuse, a refusal is always a borrow beyond the member's
share, and reclaim for fairness never names the asking member nor one within its share."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.cohort import DIMS, Verdict, admit
from gpupool.core.quota import Amount
from gpupool.core.tenantshare import (
    beyond_fair_share,
    divided,
    fairness_reclaim,
    surely_within,
    wants,
)

from .test_cohort_properties import asks, members, replay


def waiting_of(draw: st.DrawFn, names: list[str]) -> dict[str, Amount]:
    amount = st.builds(lambda g, c: Amount(g, 0, c), st.integers(0, 8), st.integers(0, 800))
    return {n: draw(amount) for n in names if draw(st.booleans())}


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_the_shortcut_admits_only_what_the_division_admits(data: st.DataObject) -> None:
    ms = data.draw(members())
    state, _ = replay(ms, data.draw(asks(len(ms))))
    waiting = waiting_of(data.draw, [m.name for m in ms])
    total = Amount()
    for a in waiting.values():
        total = total + a
    for m in ms:
        amount = data.draw(st.builds(lambda g, c: Amount(g, 0, c), st.integers(0, 3),
                                     st.integers(0, 300)))
        if admit(state, m.name, amount).verdict is not Verdict.BORROWS:
            continue
        refused = beyond_fair_share(state, m.name, amount, waiting)
        if surely_within(state, m.name, amount, total):
            assert refused is None
        if refused is not None:
            after = state.charged(m.name, amount)
            shares = divided(after, m.name, wants(state, m.name, amount, waiting), waiting)
            d = refused.dim
            assert getattr(after.borrowed(m.name), d) > getattr(shares[m.name], d)
            assert refused.share == getattr(shares[m.name], d)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_reclaim_for_fairness_takes_only_from_members_beyond_their_share(
        data: st.DataObject) -> None:
    ms = data.draw(members())
    state, _ = replay(ms, data.draw(asks(len(ms))))
    waiting = waiting_of(data.draw, [m.name for m in ms])
    for m in ms:
        amount = Amount(1, 0, 0)
        found = fairness_reclaim(state, m.name, amount, waiting)
        if found is None:
            continue
        need, over = found
        assert m.name not in over and need != Amount()
        assert beyond_fair_share(state, m.name, amount, waiting) is None
        after = state.charged(m.name, amount)
        shares = divided(after, m.name, wants(state, m.name, amount, waiting), waiting)
        for name in over:
            assert any(getattr(state.borrowed(name), d) > getattr(shares[name], d)
                       for d in DIMS)
