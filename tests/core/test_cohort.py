"""Cohorts: admission (fits, borrows, reclaims, refused) with its reasons, which pods are
borrowed, reclaim through the victim chooser, and weighted max-min fair shares — as tables."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpupool.core.allocation import Allocation
from gpupool.core.cohort import (
    Admission,
    CohortMember,
    CohortState,
    Verdict,
    admit,
    borrowed_keys,
    by_tenant,
    dominant_share,
    fair_shares,
    reclaim,
    shortfall,
    weighted_max_min,
)
from gpupool.core.errors import InvalidInput, UnknownName
from gpupool.core.quota import Amount, Charge, Limit, QuotaBook
from gpupool.core.victims import Candidate

from .builders import cluster, node

G = Amount  # Amount(gpus, memory_mib, core_pct)


def member(name: str, gpus: int | None, cohort: str | None = "research",
           borrow: int | None = None, lend: int | None = None, weight: float = 1
           ) -> CohortMember:
    return CohortMember(name, Limit(gpus=gpus), cohort,
                        None if borrow is None else Limit(gpus=borrow),
                        None if lend is None else Limit(gpus=lend), weight)


def state(*members: CohortMember, **used: int) -> CohortState:
    return CohortState.of(members, {k.replace("_", "-"): G(v) for k, v in used.items()})


A, B = member("team-a", 4), member("team-b", 4, borrow=2)


@dataclass(frozen=True)
class Row:
    about: str
    state: CohortState
    who: str
    gpus: int
    verdict: Verdict
    borrows: int = 0
    reclaim: int = 0
    reason: str = ""


ROWS = [
    Row("within the nominal, nothing borrowed", state(A, B), "team-a", 3, Verdict.FITS,
        reason="fits the nominal quota of team-a"),
    Row("beyond the nominal by one, the pool has room", state(A, B, team_b=4), "team-b", 1,
        Verdict.BORROWS, borrows=1,
        reason="team-b (cohort research) borrows 1 GPUs from cohort research"),
    Row("part within, part beyond the nominal", state(A, B, team_b=3), "team-b", 2,
        Verdict.BORROWS, borrows=1),
    Row("over nominal + borrowing limit", state(A, B, team_b=5), "team-b", 2, Verdict.REFUSED,
        reason="quota of team-b (cohort research) exceeded: 2 GPUs asked, 5 in use, nominal 4 "
               "+ borrowing limit 2, 1 left"),
    Row("a lender within its nominal whose capacity is lent out", state(A, B, team_b=6),
        "team-a", 3, Verdict.RECLAIMS, reclaim=1,
        reason="team-a (cohort research) is within its nominal quota, but cohort research "
               "lent that capacity out: 1 GPUs must be reclaimed from borrowing members"),
    Row("the lender's remaining room is still free", state(A, B, team_b=6), "team-a", 2,
        Verdict.FITS),
    Row("a borrow the full pool cannot give",
        state(A, member("team-b", 4), member("team-c", 4), team_b=6, team_c=6),
        "team-c", 1, Verdict.REFUSED,
        reason="team-c (cohort research) cannot borrow: 1 GPUs asked, 6 of its nominal 4 in "
               "use, and cohort research lends 12 in all, 12 in use, 0 left; it runs when "
               "borrowed capacity comes back or others' pods end"),
    Row("no cohort: never beyond the nominal", state(member("solo", 2, cohort=None), solo=2),
        "solo", 1, Verdict.REFUSED,
        reason="quota of solo exceeded: 1 GPUs asked, 2 of 2 in use, 0 left"),
    Row("a lending limit keeps part of the nominal guaranteed",
        state(member("team-a", 4, lend=1), member("team-b", 4), team_b=5), "team-b", 1,
        Verdict.REFUSED),
    Row("within the lending limit a borrow goes through",
        state(member("team-a", 4, lend=2), member("team-b", 4), team_b=5), "team-b", 1,
        Verdict.BORROWS, borrows=1),
    Row("the guaranteed part is never lent, so no reclaim is needed for it",
        state(member("team-a", 4, lend=2), member("team-b", 4), team_b=6), "team-a", 2,
        Verdict.FITS),
    Row("a borrowing limit of 0 means no borrowing",
        state(A, member("team-b", 4, borrow=0), team_b=4), "team-b", 1, Verdict.REFUSED),
    Row("a dimension without a nominal is not counted", state(member("gpuless", None)),
        "gpuless", 100, Verdict.FITS),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.about for r in ROWS])
def test_admission(row: Row) -> None:
    got = admit(row.state, row.who, G(row.gpus))
    assert (got.verdict, got.borrows.gpus, got.reclaim.gpus) == (row.verdict, row.borrows,
                                                                 row.reclaim)
    assert got.admitted == (row.verdict in (Verdict.FITS, Verdict.BORROWS))
    if row.reason:
        assert got.reason == row.reason


def test_a_refusal_is_permanent_only_past_nominal_plus_borrowing_limit() -> None:
    s = state(A, B, team_b=5)
    assert admit(s, "team-b", G(7)).permanent
    assert not admit(s, "team-b", G(2)).permanent


def test_memory_and_compute_are_counted_like_gpus() -> None:
    m = CohortMember("team-a", Limit(gpus=4, memory_mib=1000), "research")
    other = CohortMember("team-b", Limit(gpus=4, memory_mib=1000), "research")
    got = admit(CohortState.of([m, other]), "team-a", G(1, 1500, 0))
    assert (got.verdict, got.borrows) == (Verdict.BORROWS, G(0, 500, 0))
    assert "500 MiB of GPU memory" in got.reason


def test_unknown_members_and_bad_settings_are_refused_clearly() -> None:
    with pytest.raises(UnknownName, match="team-z has no quota in any cohort"):
        admit(state(A), "team-z", G(1))
    with pytest.raises(InvalidInput, match="weight must be a number >= 0"):
        member("x", 1, weight=-1)
    with pytest.raises(InvalidInput, match="defined twice"):
        CohortState.of([A, A])


def test_the_state_is_a_value_charged_and_refunded() -> None:
    s = state(A, B)
    after = s.charged("team-b", G(6))
    assert s.used_by("team-b") == G() and after.borrowed("team-b") == G(2)
    assert after.refunded("team-b", G(6)).used_by("team-b") == G()


def test_a_state_can_be_read_from_a_quota_book() -> None:
    book = QuotaBook()
    book.charge("p1", Charge(G(5), group="team-b"))
    s = CohortState.from_book([A, B], book)
    assert s.borrowed("team-b") == G(1) and s.lendable_idle("team-a") == G(4)


# -- borrowed pods ------------------------------------------------------------------------------
def pod(key: str, group: str, gpus: int, started: float, priority: int = 0,
        budgets: tuple[str, ...] = ()) -> Candidate:
    alloc = Allocation(key, "n", 0, 0)
    return Candidate(alloc, priority, Charge(G(gpus), tenant=f"ns-{group}", group=group),
                     budgets, started_s=started)


def test_the_youngest_pods_beyond_the_nominal_are_the_borrowed_ones() -> None:
    pods = [pod("b-old", "team-b", 2, 1.0), pod("b-mid", "team-b", 2, 2.0),
            pod("b-new", "team-b", 1, 3.0), pod("a-1", "team-a", 4, 0.5)]
    s = state(A, B, team_a=4, team_b=5)
    assert borrowed_keys(s, pods) == {"b-new"}
    pods.append(pod("b-newer", "team-b", 1, 4.0))
    assert borrowed_keys(s.charged("team-b", G(1)), pods) == {"b-new", "b-newer"}


def test_a_pod_that_straddles_the_nominal_is_borrowed() -> None:
    pods = [pod("b-1", "team-b", 3, 1.0), pod("b-2", "team-b", 3, 2.0)]
    assert borrowed_keys(state(A, B, team_b=6), pods) == {"b-2"}


def test_members_may_be_tenants() -> None:
    m = CohortMember("ns-team-b", Limit(gpus=1), "research")
    pods = [pod("b-1", "team-b", 1, 1.0), pod("b-2", "team-b", 1, 2.0)]
    assert borrowed_keys(CohortState.of([m]), pods, by_tenant) == {"b-2"}


# -- reclaim ------------------------------------------------------------------------------------
CLUSTER = cluster(node("n", gpus=8))


def borrowers() -> tuple[CohortState, list[Candidate]]:
    """team-a lends everything; team-b and team-c borrow 2 each (their youngest pods)."""
    members = (A, member("team-b", 2), member("team-c", 2))
    pods = [pod("b-1", "team-b", 2, 1.0, priority=5), pod("b-2", "team-b", 1, 5.0, priority=5),
            pod("b-3", "team-b", 1, 6.0, priority=1),
            pod("c-1", "team-c", 2, 1.0), pod("c-2", "team-c", 2, 3.0, priority=1)]
    return state(*members, team_b=4, team_c=4), pods


def test_reclaim_takes_the_lowest_priority_then_the_youngest_borrowed_pods() -> None:
    s, pods = borrowers()
    need = admit(s, "team-a", G(2))
    assert need.verdict is Verdict.RECLAIMS and need.reclaim == G(2)
    plan = reclaim(s, "team-a", need.reclaim, pods, CLUSTER)
    assert plan.restored and plan.keys == ("c-2",)  # one pod of priority 1 beats two
    one = reclaim(s, "team-a", G(1), pods, CLUSTER)
    assert one.keys == ("b-3",)  # priority 1, younger than c-2
    assert one.freed == G(1) and "give team-a back 1 GPUs" in one.reason


def test_after_reclaim_the_lender_is_admitted() -> None:
    s, pods = borrowers()
    plan = reclaim(s, "team-a", admit(s, "team-a", G(4)).reclaim, pods, CLUSTER)
    assert plan.restored
    for c in plan.victims:
        assert c.charge is not None and c.charge.group is not None
        s = s.refunded(c.charge.group, c.charge.amount)
    assert admit(s, "team-a", G(4)).admitted


def test_pods_within_their_members_nominal_are_never_reclaimed() -> None:
    s, pods = borrowers()
    assert set(reclaim(s, "team-a", G(4), pods, CLUSTER).keys) == {"b-2", "b-3", "c-2"}
    plan = reclaim(s, "team-a", G(5), pods, CLUSTER)  # only 4 GPUs are borrowed
    assert not plan.restored and plan.keys == ()  # nobody is evicted for nothing
    assert plan.reason.startswith("the borrowed pods of cohort research cannot give back "
                                  "5 GPUs")


def test_disruption_budgets_are_honoured() -> None:
    s, pods = borrowers()
    pods = [pod(c.key, c.charge.group or "", c.charge.amount.gpus, c.started_s, c.priority,
                ("web",) if c.key == "c-2" else ()) for c in pods if c.charge is not None]
    plan = reclaim(s, "team-a", G(2), pods, CLUSTER, budgets={"web": 0})
    assert plan.restored and set(plan.keys) == {"b-2", "b-3"}


def test_a_guaranteed_part_makes_reclaim_take_more_pods() -> None:
    """team-b lends none of its nominal 2: its first 2 GPUs never draw from the pool, so
    evicting a pod it runs within them gives nothing back; only borrowed pods count."""
    members = (member("team-a", 4), member("team-b", 2, lend=0))
    pods = [pod("b-1", "team-b", 2, 1.0), pod("b-2", "team-b", 2, 2.0),
            pod("b-3", "team-b", 2, 3.0)]
    s = state(*members, team_b=6)
    plan = reclaim(s, "team-a", admit(s, "team-a", G(4)).reclaim, pods, CLUSTER)
    assert plan.restored and set(plan.keys) == {"b-2", "b-3"}


# -- fair share ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("capacity", "wants", "weights", "expected"), [
    (10, {"a": 10, "b": 10}, {"a": 1, "b": 1}, {"a": 5, "b": 5}),
    (10, {"a": 10, "b": 10}, {"a": 1, "b": 4}, {"a": 2, "b": 8}),
    (10, {"a": 1, "b": 10}, {"a": 1, "b": 1}, {"a": 1, "b": 9}),
    (10, {"a": 10, "b": 10, "c": 1}, {"a": 1, "b": 2, "c": 1}, {"a": 3, "b": 6, "c": 1}),
    (7, {"a": 10, "b": 10}, {"a": 1, "b": 1}, {"a": 4, "b": 3}),
    (10, {"a": 3, "b": 3}, {"a": 1, "b": 1}, {"a": 3, "b": 3}),
    (10, {"a": 8, "z": 8}, {"a": 1, "z": 0}, {"a": 8, "z": 2}),
    (0, {"a": 8}, {"a": 1}, {"a": 0}),
], ids=["equal weights split evenly", "weights 1:4 split 2:8",
        "what one does not want goes to the other", "three members, one satisfied",
        "an odd unit goes by name at a tie", "everyone satisfied leaves capacity idle",
        "weight 0 takes only what the others leave", "nothing to divide"])
def test_weighted_max_min(capacity: int, wants: dict[str, int], weights: dict[str, float],
                          expected: dict[str, int]) -> None:
    assert weighted_max_min(capacity, wants, weights) == expected


def test_fair_shares_divide_what_the_cohort_lends_within_borrowing_limits() -> None:
    s = state(member("team-a", 8), member("team-b", 2, weight=1),
              member("team-c", 2, weight=3), member("team-d", 2, borrow=1, weight=100),
              team_a=0, team_b=2, team_c=2, team_d=2)
    shares = fair_shares(s, "research", {"team-b": G(8), "team-c": G(8), "team-d": G(8)})
    assert {k: v.gpus for k, v in shares.items()} == {"team-a": 0, "team-b": 2, "team-c": 5,
                                                       "team-d": 1}


def test_the_dominant_share_orders_who_borrows_next() -> None:
    s = state(member("team-a", 8), member("team-b", 2), member("team-c", 2, weight=2),
              team_b=4, team_c=4)
    assert dominant_share(s, "team-b") == 2 * dominant_share(s, "team-c") > 0
    assert dominant_share(s, "team-a") == 0


def test_admission_values_print_their_reason() -> None:
    got: Admission = admit(state(A, B), "team-a", G(1))
    assert got.member == "team-a" and got.cohort == "research" and got.asked == G(1)


@pytest.mark.parametrize(("used_a", "used_b", "asked", "expected"), [
    (4, 6, 1, 1), (4, 0, 1, 0), (2, 6, 3, 1), (0, 6, 3, 0)],
    ids=["a member at its nominal in a full pool gives back what it asks",
         "a member with room to borrow needs nothing back",
         "within the nominal only what passes it counts",
         "within the nominal a reclaim does it, nothing of its own"])
def test_shortfall_is_what_a_member_must_free_of_its_own(
        used_a: int, used_b: int, asked: int, expected: int) -> None:
    s = state(A, B, team_a=used_a, team_b=used_b)
    assert shortfall(s, "team-a", G(asked)) == G(expected)
    after = s.refunded("team-a", G(expected))
    assert admit(after, "team-a", G(asked)).verdict is not Verdict.REFUSED
