"""ClusterState can never over-commit: a hypothesis state machine of random operations.

Reserve (valid and invalid allocations, local and remote: CPU and memory on one node,
slices served by another), release, re-reserve, replace nodes and flip GPU health in
random order. After every step the free arrays must equal
capacity minus what the held allocations take, and never go below zero; a
failed reserve must change nothing; reserve-then-release must restore the state
exactly.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from gpupool.core.allocation import Allocation, Slice
from gpupool.core.errors import InvalidInput, OverCommit, UnknownName
from gpupool.core.model import Gpu, Node
from gpupool.core.state import ClusterState

KEYS = st.sampled_from([f"pod-{i}" for i in range(8)])
NODES = ("n0", "n1", "n2")
SLICE = st.tuples(st.integers(0, 4), st.booleans(), st.integers(-64, 41000),
                  st.integers(-5, 120), st.sampled_from(["a", "b"]))
Snapshot = tuple[tuple[Any, ...], dict[str, Allocation]]
ARRAYS = ("cpu_free", "mem_free", "unit_free", "core_free", "free_milli", "healthy")


def make_node(name: str, gpus: int, gpu_mib: int, cpu: int, mem: int,
              healthy: tuple[bool, ...] = ()) -> Node:
    return Node(name, cpu, mem, tuple(
        Gpu(f"GPU-{name}-{j}", j, "A100", gpu_mib, j // 2,
            healthy[j] if j < len(healthy) else True) for j in range(gpus)))


class ClusterMachine(RuleBasedStateMachine):
    state: ClusterState

    @initialize(unit=st.sampled_from([256, 1024]))
    def start(self, unit: int) -> None:
        self.state = ClusterState([
            make_node("n0", 2, 16384, 8000, 16384),
            make_node("n1", 4, 40960, 16000, 65536),
            make_node("n2", 0, 0, 4000, 8192),
        ], memory_unit_mib=unit)

    def snapshot(self) -> Snapshot:
        arrays = tuple(getattr(self.state, a).copy() for a in ARRAYS)
        return arrays, dict(self.state.allocations)

    def assert_unchanged(self, before: Snapshot) -> None:
        arrays, allocations = before
        for name, old in zip(ARRAYS, arrays, strict=True):
            assert np.array_equal(getattr(self.state, name), old), name
        assert self.state.allocations == allocations

    def build(self, key: str, node: str, cpu: int, mem: int,
              slices: list[tuple[int, bool, int, int, str]], served_by: str = "") -> Allocation:
        host = served_by or node
        gpus = (self.state.nodes[self.state.index[host]].gpus if host in self.state.index else ())
        parts = []
        for pos, right_uuid, mib, core, container in slices:
            uuid = gpus[pos].uuid if right_uuid and pos < len(gpus) else f"GPU-x-{pos}"
            parts.append(Slice(uuid, pos, mib, core, container))
        return Allocation(key, node, cpu, mem, tuple(parts), served_by=served_by)

    @rule(key=KEYS, node=st.sampled_from((*NODES, "ghost")), cpu=st.integers(-10, 9000),
          mem=st.integers(-10, 40000), slices=st.lists(SLICE, max_size=4),
          served_by=st.sampled_from(("", "", *NODES, "ghost")))
    def reserve(self, key: str, node: str, cpu: int, mem: int,
                slices: list[tuple[int, bool, int, int, str]], served_by: str) -> None:
        alloc = self.build(key, node, cpu, mem, slices, served_by)
        before = self.snapshot()
        try:
            self.state.reserve(alloc)
        except (OverCommit, UnknownName, InvalidInput):
            self.assert_unchanged(before)
            return
        assert self.state.allocations[key] == alloc

    @rule(data=st.data())
    def reserve_a_held_allocation_again(self, data: st.DataObject) -> None:
        if not self.state.allocations:
            return
        key = data.draw(st.sampled_from(sorted(self.state.allocations)))
        before = self.snapshot()
        self.state.reserve(self.state.allocations[key])
        self.assert_unchanged(before)

    @rule(key=KEYS)
    def release(self, key: str) -> None:
        held = self.state.allocations.get(key)
        assert self.state.release(key) == held
        assert key not in self.state.allocations
        assert self.state.release(key) is None

    @rule(key=st.just("probe"), node=st.sampled_from(NODES), cpu=st.integers(0, 4000),
          slices=st.lists(SLICE, max_size=3))
    def reserve_then_release_restores_exactly(self, key: str, node: str, cpu: int,
                                              slices: list[tuple[int, bool, int, int, str]]
                                              ) -> None:
        before = self.snapshot()
        with contextlib.suppress(OverCommit, UnknownName, InvalidInput):
            self.state.reserve(self.build(key, node, cpu, 0, slices))
        self.state.release(key)
        self.assert_unchanged(before)

    @rule(node=st.sampled_from(NODES), gpus=st.integers(0, 4),
          gpu_mib=st.sampled_from([8192, 16384, 40960]), cpu=st.integers(0, 16000),
          mem=st.integers(0, 65536), healthy=st.lists(st.booleans(), min_size=4, max_size=4))
    def replace_node(self, node: str, gpus: int, gpu_mib: int, cpu: int, mem: int,
                     healthy: list[bool]) -> None:
        held = {a.key for a in self.state.allocations_on(node)}
        lost = self.state.replace_node(make_node(node, gpus, gpu_mib, cpu, mem, tuple(healthy)))
        lost_keys = {a.key for a in lost}
        assert lost_keys <= held
        assert {a.key for a in self.state.allocations_on(node)} == held - lost_keys
        assert not lost_keys & set(self.state.allocations)

    @rule(node=st.sampled_from(NODES), healthy=st.lists(st.booleans(), min_size=4, max_size=4))
    def replace_node_with_only_its_health_changed(self, node: str, healthy: list[bool]) -> None:
        current = self.state.nodes[self.state.index[node]]
        gpus = tuple(replace(g, healthy=healthy[j]) for j, g in enumerate(current.gpus))
        before = {a.key for a in self.state.allocations_on(node)}
        assert self.state.replace_node(replace(current, gpus=gpus)) == []
        assert {a.key for a in self.state.allocations_on(node)} == before

    @rule(node=st.sampled_from(NODES), pos=st.integers(0, 3), healthy=st.booleans())
    def set_health(self, node: str, pos: int, healthy: bool) -> None:
        gpus = self.state.nodes[self.state.index[node]].gpus
        if pos < len(gpus):
            self.state.set_health(node, gpus[pos].uuid, healthy)
            assert bool(self.state.healthy[self.state.index[node], pos]) is healthy

    @invariant()
    def nothing_is_over_committed(self) -> None:
        s = self.state
        present = s.present
        assert (s.cpu_free >= 0).all() and (s.mem_free >= 0).all()
        assert (s.unit_free[present] >= 0).all() and (s.core_free[present] >= 0).all()

    @invariant()
    def free_is_capacity_minus_what_allocations_hold(self) -> None:
        s = self.state
        cpu, mem = s.cpu_cap.copy(), s.mem_cap.copy()
        units, core = s.unit_cap.copy(), s.core_cap.copy()
        for a in s.allocations.values():
            i, k = s.index[a.node], s.index[a.gpu_node]
            cpu[i] -= a.cpu_milli
            mem[i] -= a.memory_mib
            for x in a.slices:
                assert s.nodes[k].gpus[x.gpu_position].uuid == x.gpu_uuid
                units[k, x.gpu_position] -= s.units_for(x.memory_mib)
                core[k, x.gpu_position] -= x.core_pct
        assert np.array_equal(cpu, s.cpu_free) and np.array_equal(mem, s.mem_free)
        assert np.array_equal(units, s.unit_free) and np.array_equal(core, s.core_free)

    @invariant()
    def the_free_share_follows_the_free_arrays(self) -> None:
        s = self.state
        ok = s.present & s.healthy
        share = np.minimum(s.core_free * 10, s.unit_free * 1000 // np.maximum(s.unit_cap, 1))
        assert np.array_equal(np.where(ok, share, -1), s.free_milli)

    @invariant()
    def the_change_count_moves_with_every_row_version(self) -> None:
        assert self.state.changes == int(self.state.version.sum())

    @invariant()
    def the_per_node_index_agrees_with_the_allocations(self) -> None:
        for name in NODES:
            expected = {k for k, a in self.state.allocations.items() if name in a.nodes}
            assert {a.key for a in self.state.allocations_on(name)} == expected


ClusterMachine.TestCase.settings = settings(
    max_examples=120, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_cluster_state_never_over_commits = ClusterMachine.TestCase
