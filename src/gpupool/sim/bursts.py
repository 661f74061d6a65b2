"""Bursts in a replay: granted when a GPU has room, reclaimed when a request needs it.

The simulator's model of the node agent's usage monitor (``nodeagent.burst``), in GPU
memory only, with the same rule (``core.burst``): every slice on a GPU uses its request,
except a burstable slice that got its burst, which uses its limit. When a burstable
slice is placed its burst is **granted** if the GPU has room for it at its limit (the
GPU would not be short), else **refused** (it uses its request). When any slice is
placed (its request first), a GPU left short has bursts **reclaimed**, most recent
first, until it is not (each reclaimed slice uses its request from then on; in a cluster
the over-use action does it). A slice that leaves takes its use with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpupool.core import burst as burst_rule
from gpupool.core.allocation import Allocation
from gpupool.core.state import ClusterState

Gpu = tuple[int, int]  # (node row, GPU position)


@dataclass
class _Use:
    key: str
    request_mib: int
    use_mib: int
    since: float


@dataclass
class BurstBook:
    """Per GPU, what each slice uses; counts of bursts granted, refused and reclaimed."""

    state: ClusterState
    granted: int = 0
    refused: int = 0
    reclaimed: int = 0
    _gpus: dict[Gpu, list[_Use]] = field(default_factory=dict)
    _where: dict[str, list[Gpu]] = field(default_factory=dict)

    def placed(self, alloc: Allocation, now: float) -> None:
        """Account ``alloc`` (just reserved): grant its bursts, reclaim where short."""
        k = self.state.node_index(alloc.gpu_node)
        for s in alloc.slices:
            gpu = (k, s.gpu_position)
            uses = self._gpus.setdefault(gpu, [])
            self._where.setdefault(alloc.key, []).append(gpu)
            mine = _Use(alloc.key, s.memory_mib, s.memory_mib, now)
            uses.append(mine)
            self._reclaim(gpu)  # its request first: bursts give way
            if s.burst_memory_mib:
                mine.use_mib = s.memory_limit_mib
                room = self._short(gpu) == 0
                mine.use_mib = s.memory_limit_mib if room else s.memory_mib
                self.granted += room
                self.refused += not room

    def released(self, key: str) -> None:
        for gpu in self._where.pop(key, ()):
            self._gpus[gpu] = [u for u in self._gpus[gpu] if u.key != key]

    def _capacity(self, gpu: Gpu) -> int:
        return int(self.state.nodes[gpu[0]].gpus[gpu[1]].memory_mib)

    def _short(self, gpu: Gpu) -> int:
        uses = [(u.use_mib, u.request_mib) for u in self._gpus.get(gpu, ())]
        return burst_rule.short(self._capacity(gpu), uses)

    def _reclaim(self, gpu: Gpu) -> None:
        lacking = self._short(gpu)
        if lacking <= 0:
            return
        uses = self._gpus[gpu]
        bursts = [burst_rule.Bursting(i, u.since, u.use_mib - u.request_mib)
                  for i, u in enumerate(uses) if u.use_mib > u.request_mib]
        for b, _ in burst_rule.reclaim(bursts, lacking):
            uses[b.key].use_mib = uses[b.key].request_mib
            self.reclaimed += 1
