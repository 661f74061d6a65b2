"""Logical devices: split, swap onto the decided GPU, restore, health."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.errors import InvalidInput, OverCommit
from gpupool.nodeagent.gpu import GpuInfo
from gpupool.nodeagent.logical import LogicalPool, Split

from .builders import uuid_of


def gpus(n: int, memory_mib: int = 16384) -> list[GpuInfo]:
    return [GpuInfo(uuid_of(i), i, "A100", memory_mib, numa_node=i % 2) for i in range(n)]


def test_split_is_fixed_or_follows_memory() -> None:
    assert len(LogicalPool(gpus(2), Split(per_gpu=5)).devices()) == 10
    assert len(LogicalPool(gpus(2, 8192), Split(mib_per_device=2048)).devices()) == 8
    assert len(LogicalPool(gpus(1, 512), Split(mib_per_device=2048)).devices()) == 1
    with pytest.raises(InvalidInput):
        Split(per_gpu=-1)


def test_a_device_on_the_wrong_gpu_is_swapped_with_a_free_one_of_the_decided_gpu() -> None:
    pool = LogicalPool(gpus(2), Split(2))
    a0, a1, b0, b1 = "vgpu-0000", "vgpu-0001", "vgpu-0002", "vgpu-0003"
    assert pool.owner(a0) == uuid_of(0) and pool.owner(b0) == uuid_of(1)
    before = pool.version
    assert pool.assign([a0], [uuid_of(1)], busy={b0}) == {a0: uuid_of(1)}
    assert pool.owner(a0) == uuid_of(1) and pool.owner(b1) == uuid_of(0)  # b0 was busy
    assert pool.owner(a1) == uuid_of(0) and pool.version > before
    assert [d.numa_node for d in pool.devices() if d.id == a0] == [1]


def test_a_device_already_on_the_decided_gpu_stays() -> None:
    pool = LogicalPool(gpus(2), Split(2))
    before = pool.version
    assert pool.assign(["vgpu-0002"], [uuid_of(1)], busy=set()) == {"vgpu-0002": uuid_of(1)}
    assert pool.version == before


def test_a_gpu_without_a_free_logical_device_refuses_and_changes_nothing() -> None:
    pool = LogicalPool(gpus(2), Split(1))
    owners = pool.owners()
    with pytest.raises(OverCommit, match="no free logical device"):
        pool.assign(["vgpu-0000"], [uuid_of(1)], busy={"vgpu-0001"})
    assert pool.owners() == owners


def test_unknown_ids_are_refused() -> None:
    with pytest.raises(InvalidInput, match="not one this agent advertises"):
        LogicalPool(gpus(1), Split(1)).assign(["nope"], [uuid_of(0)], busy=set())


def test_restore_reapplies_remembered_assignments() -> None:
    pool = LogicalPool(gpus(3), Split(2))
    pool.restore({"vgpu-0000": uuid_of(2), "vgpu-0001": uuid_of(2)})
    assert pool.owner("vgpu-0000") == pool.owner("vgpu-0001") == uuid_of(2)
    assert Counter(pool.owners().values()) == {uuid_of(i): 2 for i in range(3)}


def test_health_and_vanishing_show_in_the_device_list() -> None:
    pool = LogicalPool(gpus(2), Split(2))
    sick = [gpus(2)[0], GpuInfo(uuid_of(1), 1, "A100", 16384, 1, healthy=False)]
    pool.update_gpus(sick)
    assert [d.health for d in pool.devices()] == ["Healthy"] * 2 + ["Unhealthy"] * 2
    pool.update_gpus(sick[:1])
    assert [d.id for d in pool.devices()] == ["vgpu-0000", "vgpu-0001"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 11), st.integers(0, 2)), max_size=30))
def test_swaps_keep_each_gpus_count_and_never_move_a_held_device(
        moves: list[tuple[int, int]]) -> None:
    pool = LogicalPool(gpus(3), Split(4))
    busy: set[str] = set()
    for lid_n, target in moves:
        lid = f"vgpu-{lid_n:04d}"
        if lid in busy:
            continue
        held = {b: pool.owner(b) for b in busy}
        try:
            got = pool.assign([lid], [uuid_of(target)], busy)
        except OverCommit:
            continue
        assert got == {lid: uuid_of(target)} and pool.owner(lid) == uuid_of(target)
        busy.add(lid)
        assert Counter(pool.owners().values()) == {uuid_of(i): 4 for i in range(3)}
        assert all(pool.owner(b) == u for b, u in held.items())  # held devices never move


def test_a_remote_slices_device_is_traded_so_its_gpu_keeps_every_slice() -> None:
    """GPU 0's one device is held by a container whose slice a slice server serves (no GPU
    of this node behind it): a local slice of GPU 0 still gets a device of GPU 0, and the
    floating device moves to GPU 1, which gives up its free one."""
    pool = LogicalPool(gpus(2), Split(1))
    remote, local = "vgpu-0000", "vgpu-0001"  # kubelet gave the new container GPU 1's
    assert pool.owner(remote) == uuid_of(0)
    with pytest.raises(OverCommit):  # without knowing it floats, GPU 0 looks full
        pool.assign([local], [uuid_of(0)], busy={remote})
    assert pool.assign([local], [uuid_of(0)], busy={remote}, floating={remote}) == \
        {local: uuid_of(0)}
    assert (pool.owner(local), pool.owner(remote)) == (uuid_of(0), uuid_of(1))
    assert Counter(pool.owners().values()) == {uuid_of(0): 1, uuid_of(1): 1}


def test_a_gpu_whose_devices_all_hold_local_slices_still_refuses() -> None:
    pool = LogicalPool(gpus(2), Split(1))
    owners = pool.owners()
    with pytest.raises(OverCommit, match="no free logical device"):  # vgpu-0000: local
        pool.assign(["vgpu-0001"], [uuid_of(0)], busy={"vgpu-0000"}, floating=set())
    assert pool.owners() == owners  # nothing moved


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 11), st.integers(0, 3)), max_size=30))
def test_floating_devices_never_cost_a_slice_while_any_gpu_has_a_free_device(
        moves: list[tuple[int, int]]) -> None:
    """Target 3 stands for a remote slice (the device floats); a local slice is refused only
    when its GPU's devices all hold local slices (kubelet's device is itself one nobody
    holds, so a floating device of the GPU can always be traded for it)."""
    pool = LogicalPool(gpus(3), Split(4))
    busy: dict[str, str] = {}  # held device -> the GPU its slice is on ("": remote)
    for lid_n, target in moves:
        lid = f"vgpu-{lid_n:04d}"
        if lid in busy:
            continue
        if target == 3:
            busy[lid] = ""
            continue
        floating = {b for b, u in busy.items() if not u}
        local_on_target = sum(1 for u in busy.values() if u == uuid_of(target))
        try:
            got = pool.assign([lid], [uuid_of(target)], set(busy), floating)
        except OverCommit:
            assert local_on_target == 4
            continue
        assert got == {lid: uuid_of(target)}
        held = {b: pool.owner(b) for b, u in busy.items() if u}
        busy[lid] = uuid_of(target)
        assert Counter(pool.owners().values()) == {uuid_of(i): 4 for i in range(3)}
        assert all(pool.owner(b) == u for b, u in held.items())  # local slices never move
