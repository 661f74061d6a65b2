"""Logical devices: what kubelet sees of the node's GPUs.

Every physical GPU is split into a fixed number of logical devices (from its
memory, or a configured split). Kubelet counts and picks logical devices; the
agent decides which physical GPU serves each one. When kubelet picks a logical
device that currently belongs to GPU X but the decision says GPU Y, the agent
swaps it with a free logical device of Y, so every GPU keeps exactly its
number of logical devices and the free ones always say how much room a GPU has.

IDs are neutral (``vgpu-0007``) because a logical device can move between
GPUs; the NUMA node advertised for it is that of its current GPU, and every
change (health, vanish, swap) bumps ``version`` so ListAndWatch resends.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpupool.core.errors import InvalidInput, OverCommit
from gpupool.core.mig import MigMode
from gpupool.nodeagent.gpu import HEALTHY, UNHEALTHY, GpuInfo

DEFAULT_MIB_PER_DEVICE = 1024


@dataclass(frozen=True, slots=True)
class Split:
    """How many logical devices a GPU gets: ``per_gpu`` if set, else one per ``mib_per_device``."""

    per_gpu: int = 0
    mib_per_device: int = DEFAULT_MIB_PER_DEVICE

    def __post_init__(self) -> None:
        if self.per_gpu < 0 or self.mib_per_device <= 0:
            raise InvalidInput("the split must be a positive number of devices per GPU "
                               "or a positive number of MiB per device")

    def count(self, gpu: GpuInfo) -> int:
        if isinstance(gpu.mig, MigMode):
            return 0  # a GPU in MIG mode: its MIG devices get the logical devices
        if self.per_gpu:
            return self.per_gpu
        return max(1, gpu.memory_mib // self.mib_per_device)


@dataclass(frozen=True, slots=True)
class LogicalDevice:
    """One advertised device: its ID, health and NUMA node (of the GPU serving it)."""

    id: str
    health: str
    numa_node: int
    gpu_uuid: str


class LogicalPool:
    """The logical-to-physical mapping; thread-safe, versioned."""

    def __init__(self, gpus: Sequence[GpuInfo], split: Split):
        self.split = split
        self._cond = threading.Condition()
        self._owner: dict[str, str] = {}
        self._gpus: dict[str, GpuInfo] = {}
        self._order: list[str] = []
        self.version = 0
        self._add_slots(gpus)
        self.update_gpus(gpus)

    def _add_slots(self, gpus: Iterable[GpuInfo]) -> None:
        for gpu in gpus:
            if gpu.uuid in self._owner.values():
                continue
            for _ in range(self.split.count(gpu)):
                lid = f"vgpu-{len(self._order):04d}"
                self._order.append(lid)
                self._owner[lid] = gpu.uuid

    # -- what kubelet sees ---------------------------------------------------------
    def devices(self) -> list[LogicalDevice]:
        """Logical devices of present GPUs, in ID order."""
        with self._cond:
            return [self._device(lid) for lid in self._order if self._owner[lid] in self._gpus]

    def _device(self, lid: str) -> LogicalDevice:
        gpu = self._gpus[self._owner[lid]]
        return LogicalDevice(lid, HEALTHY if gpu.healthy else UNHEALTHY, gpu.numa_node, gpu.uuid)

    def owners(self) -> dict[str, str]:
        """Logical ID -> GPU uuid, for every logical device (present GPUs or not)."""
        with self._cond:
            return dict(self._owner)

    def owner(self, lid: str) -> str:
        with self._cond:
            return self._owner_of(lid)

    def _owner_of(self, lid: str) -> str:
        try:
            return self._owner[lid]
        except KeyError:
            raise InvalidInput(f"logical device {lid} is not one this agent advertises") from None

    def wait_change(self, seen: int, timeout: float) -> int:
        """Block until ``version`` differs from ``seen`` (or timeout); the current version."""
        with self._cond:
            self._cond.wait_for(lambda: self.version != seen, timeout)
            return self.version

    # -- changes ------------------------------------------------------------------------
    def update_gpus(self, gpus: Sequence[GpuInfo]) -> None:
        """The GPUs present now (health, vanish, return, new GPUs)."""
        with self._cond:
            self._add_slots(gpus)
            fresh = {g.uuid: g for g in gpus if not isinstance(g.mig, MigMode)}  # not handed out
            if fresh != self._gpus:
                self._gpus = fresh
                self._bump()

    def restore(self, owners: Mapping[str, str]) -> None:
        """Re-apply remembered assignments (logical ID -> GPU uuid), e.g. after a restart."""
        with self._cond:
            pinned = set(owners)
            for lid, uuid in owners.items():
                if lid in self._owner and self._owner[lid] != uuid:
                    spare = [m for m in self._order
                             if self._owner[m] == uuid and m not in pinned]
                    if spare:
                        self._swap(lid, spare[0])
            self._bump()

    def assign(self, ids: Sequence[str], targets: Sequence[str], busy: Collection[str]
               ) -> dict[str, str]:
        """Map kubelet's ``ids`` onto the GPUs ``targets`` (one uuid per id, repeats allowed).

        ``busy`` are logical devices held by other containers. IDs already on a
        target GPU stay; the others are swapped with a free device of the
        target. Returns logical ID -> GPU uuid. Raises ``OverCommit`` (nothing
        changed) when a target GPU has no free logical device left.
        """
        if len(ids) != len(targets):
            raise InvalidInput(f"{len(ids)} logical devices for {len(targets)} GPU slices")
        with self._cond:
            for lid in ids:
                self._owner_of(lid)
            plan = self._plan(list(ids), list(targets), set(busy) | set(ids))
            for lid, spare in plan.swaps:
                self._swap(lid, spare)
            if plan.swaps:
                self._bump()
            return dict(plan.result)

    def _plan(self, ids: list[str], targets: list[str], taken: set[str]) -> _Plan:
        wanted = list(targets)
        result: list[tuple[str, str]] = []
        moving: list[str] = []
        for lid in ids:
            if self._owner[lid] in wanted:
                wanted.remove(self._owner[lid])
                result.append((lid, self._owner[lid]))
            else:
                moving.append(lid)
        swaps: list[tuple[str, str]] = []
        for lid, uuid in zip(moving, wanted, strict=True):
            spare = next((m for m in self._order if self._owner[m] == uuid and m not in taken),
                         None)
            if spare is None:
                raise OverCommit(f"GPU {uuid} has no free logical device left "
                                 f"(all {self._count(uuid)} are in use)")
            taken.add(spare)
            swaps.append((lid, spare))
            result.append((lid, uuid))
        return _Plan(swaps, result)

    def _count(self, uuid: str) -> int:
        return sum(1 for o in self._owner.values() if o == uuid)

    def _swap(self, a: str, b: str) -> None:
        self._owner[a], self._owner[b] = self._owner[b], self._owner[a]

    def _bump(self) -> None:
        self.version += 1
        self._cond.notify_all()


@dataclass(frozen=True, slots=True)
class _Plan:
    swaps: list[tuple[str, str]]
    result: list[tuple[str, str]]
