"""``FitCheck``: a ledger's entries plus a new one must fit the node's GPUs, whatever
order they were written in; one reservation of every slice decides it."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from gpupool.core.allocation import Allocation, Slice
from gpupool.core.errors import OverCommit, UnknownName
from gpupool.core.model import Gpu, Node
from gpupool.core.state import ClusterState
from gpupool.extender.state.ledger import FitCheck, gpu_only

CHECK = FitCheck()  # one for the whole module: checks reuse its kept states, as binds do
NODE = Node("n1", 64_000, 512 * 1024, tuple(Gpu(f"GPU-n1-{j}", j, "A100", 40_960)
                                            for j in range(4)))


def alloc(key: str, *parts: tuple[int, int, int]) -> Allocation:
    """(GPU position, MiB, compute %) slices of ``key`` on NODE."""
    return Allocation(key, "n1", 1000, 1024, tuple(
        Slice(f"GPU-n1-{j}", j, mib, core, "c0") for j, mib, core in parts))


def one_by_one(node: Node, held: list[Allocation], new: Allocation) -> bool:
    """The oracle: reserve every entry, then the new one, on a fresh state of the node."""
    node = replace(node, gpus=tuple(replace(g, healthy=True) for g in node.gpus))
    state = ClusterState([node], 1)
    try:
        for a in held:
            if a.key == new.key:
                continue
            try:
                state.reserve(gpu_only(a, node))
            except UnknownName:
                continue
        state.reserve(gpu_only(new, node))
    except OverCommit:
        return False
    return True


def fits(held: list[Allocation], new: Allocation, node: Node = NODE) -> bool:
    try:
        CHECK.check(node, held, new, 1)
    except OverCommit:
        return False
    return True


def test_entries_that_fill_a_gpu_exactly_fit_and_one_more_mib_does_not() -> None:
    held = [alloc("a", (0, 20_480, 40)), alloc("b", (0, 10_240, 30))]
    assert fits(held, alloc("new", (0, 10_240, 30)))
    assert not fits(held, alloc("new", (0, 10_241, 30)))
    assert not fits(held, alloc("new", (0, 10_240, 31)))  # compute runs out first


def test_slices_on_other_gpus_do_not_count_against_the_new_one() -> None:
    held = [alloc("a", (1, 40_960, 100)), alloc("b", (2, 40_960, 100), (3, 40_960, 100))]
    assert fits(held, alloc("new", (0, 40_960, 100)))
    assert not fits(held, alloc("new", (0, 20_480, 50), (1, 1, 1)))


def test_an_entry_naming_a_gpu_the_node_lost_is_skipped() -> None:
    lost = Allocation("gone", "n1", 0, 0, (Slice("GPU-elsewhere", 0, 40_960, 100),))
    assert fits([lost], alloc("new", (0, 40_960, 100)))


def test_an_unhealthy_gpu_keeps_its_holders_and_still_takes_what_fits() -> None:
    sick = replace(NODE, gpus=(replace(NODE.gpus[0], healthy=False), *NODE.gpus[1:]))
    assert fits([alloc("a", (0, 20_480, 50))], alloc("new", (0, 20_480, 50)), sick)
    assert not fits([alloc("a", (0, 20_480, 50))], alloc("new", (0, 20_481, 50)), sick)


def test_the_new_entry_replaces_its_own_older_copy() -> None:
    assert fits([alloc("new", (0, 40_960, 100))], alloc("new", (0, 40_960, 100)))


def test_the_new_entry_must_name_gpus_of_the_node() -> None:
    stray = Allocation("new", "n1", 0, 0, (Slice("GPU-elsewhere", 0, 1, 1),))
    with pytest.raises(UnknownName):
        CHECK.check(NODE, [], stray, 1)


@pytest.mark.parametrize("seed", range(200))
def test_one_reservation_of_every_slice_decides_as_reserving_them_one_by_one(seed: int) -> None:
    rng = random.Random(seed)

    def random_alloc(key: str) -> Allocation:
        gpus = rng.sample(range(4), rng.choice((1, 1, 1, 2)))
        return alloc(key, *((j, rng.choice((4096, 8192, 10_240, 20_480, 40_960)),
                             rng.choice((10, 20, 30, 50, 100))) for j in gpus))

    held = [random_alloc(f"e{k}") for k in range(rng.randrange(0, 10))]
    new = random_alloc("new")
    assert fits(held, new) == one_by_one(NODE, held, new)


def test_a_refused_check_leaves_nothing_behind_for_the_next_one() -> None:
    """Checks replay on a one-node state kept per GPU layout: a refusal must not hold
    anything, a success must give everything back."""
    full = [alloc("a", (0, 40_960, 100))]
    for _ in range(3):
        assert not fits(full, alloc("new", (0, 1, 1)))
        assert fits([], alloc("new", (0, 40_960, 100)))


def test_a_node_that_changed_is_checked_against_its_new_gpus() -> None:
    small = replace(NODE, gpus=tuple(replace(g, memory_mib=20_480) for g in NODE.gpus))
    assert fits([], alloc("new", (0, 40_960, 100)), NODE)
    assert not fits([], alloc("new", (0, 40_960, 100)), small)
    assert fits([], alloc("new", (0, 20_480, 100)), small)


def test_bind_threads_checking_at_once_get_the_answers_of_a_fresh_state() -> None:
    rng = random.Random(7)
    cases = []
    for k in range(400):
        held = [alloc(f"e{k}-{i}", (rng.randrange(4), rng.choice((8192, 20_480, 40_960)),
                                    rng.choice((20, 50, 100)))) for i in range(rng.randrange(4))]
        new = alloc("new", (rng.randrange(4), rng.choice((8192, 20_480, 40_960)), 50))
        cases.append((held, new, one_by_one(NODE, held, new)))
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda case: fits(case[0], case[1]), cases))
    assert got == [expected for _, _, expected in cases]
    assert True in got and False in got
