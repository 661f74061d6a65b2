"""The quota need's reprieve keeps running sums (``victims_quota.spare_in_turn``); it must
spare exactly the pods the generic reprieve (a fit check of the whole rest per pod) spares."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hypothesis import given
from hypothesis import strategies as st

from gpupool.core.quota import Amount
from gpupool.core.victims_quota import Wanted, adds_up, spare_in_turn
from gpupool.core.victims_search import Chosen

amounts_st = st.lists(st.builds(Amount, st.integers(0, 4), st.integers(0, 80_000),
                                st.integers(0, 400)), min_size=0, max_size=25)
wanted_st = st.lists(st.sampled_from([("gpus", 1), ("gpus", 3), ("memory_mib", 40_000),
                                      ("core_pct", 150), ("memory_mib", 1)]),
                     max_size=3, unique_by=lambda w: w[0])


def generic(fits: Callable[[Chosen], bool], chosen: Chosen, order: Sequence[int]) -> Chosen:
    for k in order:
        rest = tuple(j for j in chosen if j != k)
        if fits(rest):
            chosen = rest
    return chosen


@given(amounts_st, wanted_st, st.randoms(use_true_random=False))
def test_running_sums_spare_exactly_the_pods_the_whole_set_check_spares(
        amounts: list[Amount], wanted: Wanted, rnd: object) -> None:
    chosen = tuple(range(len(amounts)))
    order = list(chosen)
    rnd.shuffle(order)  # type: ignore[attr-defined]
    fits = adds_up(amounts, wanted)
    got = spare_in_turn(amounts, wanted)(chosen, order)
    assert got == generic(fits, chosen, order)
    if fits(chosen):
        assert fits(got)


def test_nothing_wanted_spares_everyone_and_one_big_pod_is_kept() -> None:
    amounts = [Amount(1, 10, 10), Amount(4, 40, 40), Amount(1, 10, 10)]
    assert spare_in_turn(amounts, [])((0, 1, 2), [0, 1, 2]) == ()
    assert spare_in_turn(amounts, [("gpus", 4)])((0, 1, 2), [0, 1, 2]) == (1,)
    assert spare_in_turn(amounts, [("gpus", 5)])((0, 1, 2), [1, 0, 2]) == (1, 2)
