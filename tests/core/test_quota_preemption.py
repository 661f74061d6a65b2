"""Priorities inside a quota: when a tenant's (or a group's) quota is full, its pod of higher
priority may preempt its own pods of lower priority — through the one victim chooser,
``core.victims.select``, scoped by ``all_of(below(p), in_tenant(t))`` or ``in_group(g)``."""

from __future__ import annotations

import pytest

from gpupool.core.quota import Amount, Charge
from gpupool.core.state import ClusterState
from gpupool.core.victims import (
    Candidate,
    NoVictims,
    Quota,
    Room,
    Selection,
    all_of,
    below,
    in_group,
    in_tenant,
    select,
)

from .builders import cluster, hold_whole, node, pod, whole

# key: (node, GPU positions, tenant, group, priority, started)
PODS = {
    "a-low-old": ("n1", (0,), "team-a", "ga", 1, 10.0),
    "a-low-new": ("n1", (1,), "team-a", "ga", 1, 20.0),
    "a-mid": ("n1", (2, 3), "team-a", "ga", 5, 5.0),
    "a-high": ("n2", (0,), "team-a", "ga", 9, 1.0),
    "b-lowest": ("n2", (1,), "team-b", "gb", 0, 30.0),
}


def candidates(s: ClusterState, budgets: dict[str, tuple[str, ...]] | None = None
               ) -> list[Candidate]:
    out = []
    for key, (where, gpus, tenant, group, priority, started) in PODS.items():
        alloc = hold_whole(s, key, where, *gpus)
        charge = Charge(Amount(len(gpus), 0, 100 * len(gpus)), tenant, None, group)
        out.append(Candidate(alloc, priority, charge, (budgets or {}).get(key, ()),
                             started_s=started))
    return out


def setup() -> tuple[ClusterState, list[Candidate]]:
    s = cluster(node("n1", gpus=4), node("n2", gpus=2))
    return s, candidates(s)


@pytest.mark.parametrize(("asked", "priority", "expected"), [
    (1, 5, {"a-low-new"}),
    (2, 5, {"a-low-old", "a-low-new"}),
    (2, 9, {"a-mid"}),
    (3, 9, {"a-mid", "a-low-new"}),
], ids=["one GPU back: the younger of the two lowest",
        "two GPUs back at priority 5: both pods below it",
        "two GPUs back at priority 9: one pod beats two",
        "three GPUs back: the fewest pods, then the lowest priorities, then the youngest"])
def test_a_tenant_takes_quota_back_from_its_own_lower_priority_pods(
        asked: int, priority: int, expected: set[str]) -> None:
    s, pool = setup()
    got = select(Quota(s, Amount(gpus=asked)), pool, all_of(below(priority), in_tenant("team-a")))
    assert isinstance(got, Selection) and set(got.keys) == expected
    assert all(c.charge is not None and c.charge.tenant == "team-a" for c in got.victims)


def test_another_tenants_pods_are_never_taken_even_of_lower_priority() -> None:
    s, pool = setup()
    got = select(Quota(s, Amount(gpus=1)), pool, all_of(below(9), in_tenant("team-a")))
    assert isinstance(got, Selection) and "b-lowest" not in got.keys


def test_pods_of_equal_or_higher_priority_are_never_taken() -> None:
    s, pool = setup()
    got = select(Quota(s, Amount(gpus=1)), pool, all_of(below(1), in_tenant("team-a")))
    assert isinstance(got, NoVictims)
    assert "hold less than 1 GPUs" in got.message


def test_the_group_scope_works_the_same() -> None:
    s, pool = setup()
    got = select(Quota(s, Amount(gpus=1)), pool, all_of(below(9), in_group("gb")))
    assert isinstance(got, Selection) and got.keys == ("b-lowest",)


def test_disruption_budgets_hold_inside_a_quota_too() -> None:
    s = cluster(node("n1", gpus=4), node("n2", gpus=2))
    pool = candidates(s, {"a-low-new": ("web",)})
    got = select(Quota(s, Amount(gpus=1)), pool, all_of(below(5), in_tenant("team-a")),
                 budgets={"web": 0})
    assert isinstance(got, Selection) and got.keys == ("a-low-old",)  # not the younger one


def test_room_on_a_node_comes_from_the_tenants_own_pods_only() -> None:
    s, pool = setup()
    request = pod("a-new", whole(1), tenant="team-a")
    got = select(Room(s, request), pool, all_of(below(9), in_tenant("team-a")))
    assert isinstance(got, Selection) and got.keys == ("a-low-new",) and got.node == "n1"
    other = select(Room(s, request), pool, all_of(below(9), in_tenant("team-b")))
    assert isinstance(other, Selection) and other.keys == ("b-lowest",) and other.node == "n2"
    none = select(Room(s, request), pool, all_of(below(1), in_tenant("team-a")))
    assert isinstance(none, NoVictims)
