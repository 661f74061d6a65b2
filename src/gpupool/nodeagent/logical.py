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

A container whose slice a slice server serves (a ``remote-allowed`` pod's, docs/remote.md)
still holds the logical devices kubelet gave it, but no GPU of this node is behind them:
they are *floating*. Kubelet counts them, so they stay taken; but they belong to no GPU in
particular, so when a GPU has no free device left, one of its floating devices moves to
another GPU with a free one, which that GPU gives up in exchange (``assign``). A floating
device therefore never costs one GPU a slice while any GPU has a free device.
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

    def assign(self, ids: Sequence[str], targets: Sequence[str], busy: Collection[str],
               floating: Collection[str] = ()) -> dict[str, str]:
        """Map kubelet's ``ids`` onto the GPUs ``targets`` (one uuid per id, repeats allowed).

        ``busy`` are logical devices held by other containers, ``floating`` those of them
        with no GPU of this node behind them (a remote slice's). IDs already on a target
        GPU stay; the others are swapped with a free device of the target, which, when it
        has none, first trades one of its floating devices for a free device of another
        GPU. Returns logical ID -> GPU uuid. Raises ``OverCommit`` (nothing changed) when
        a target GPU has no free logical device left.
        """
        if len(ids) != len(targets):
            raise InvalidInput(f"{len(ids)} logical devices for {len(targets)} GPU slices")
        with self._cond:
            for lid in ids:
                self._owner_of(lid)
            owner = dict(self._owner)
            result = self._plan(owner, list(ids), list(targets), set(busy) | set(ids),
                                set(floating) - set(ids))
            if owner != self._owner:
                self._owner = owner
                self._bump()
            return result

    def _plan(self, owner: dict[str, str], ids: list[str], targets: list[str],
              taken: set[str], floating: set[str]) -> dict[str, str]:
        """Move ``ids`` onto ``targets`` in ``owner`` (a copy, kept only if it all works)."""
        wanted = list(targets)
        result: dict[str, str] = {}
        moving: list[str] = []
        for lid in ids:
            if owner[lid] in wanted:
                wanted.remove(owner[lid])
                result[lid] = owner[lid]
            else:
                moving.append(lid)
        for lid, uuid in zip(moving, wanted, strict=True):
            spare = self._free(owner, uuid, taken) or \
                self._traded(owner, lid, uuid, taken, floating)
            if spare is None:
                raise OverCommit(f"GPU {uuid} has no free logical device left "
                                 f"(all {self._count(uuid)} are in use)")
            taken.add(spare)
            owner[lid], owner[spare] = owner[spare], owner[lid]
            result[lid] = uuid
        return result

    def _free(self, owner: Mapping[str, str], uuid: str, taken: Collection[str]) -> str | None:
        return next((m for m in self._order if owner[m] == uuid and m not in taken), None)

    def _traded(self, owner: dict[str, str], lid: str, uuid: str, taken: Collection[str],
                floating: Collection[str]) -> str | None:
        """A device for GPU ``uuid`` got by giving one of its floating devices to another
        present GPU in exchange for a device of that GPU nobody holds — ``lid`` itself
        first, which leaves its GPU anyway (None: no such pair)."""
        gone = next((m for m in self._order if owner[m] == uuid and m in floating), None)
        spare = next((m for m in (lid, *self._order) if owner[m] != uuid
                      and owner[m] in self._gpus and (m == lid or m not in taken)), None)
        if gone is None or spare is None:
            return None
        owner[gone], owner[spare] = owner[spare], owner[gone]
        return spare

    def _count(self, uuid: str) -> int:
        return sum(1 for o in self._owner.values() if o == uuid)

    def _swap(self, a: str, b: str) -> None:
        self._owner[a], self._owner[b] = self._owner[b], self._owner[a]

    def _bump(self) -> None:
        self.version += 1
        self._cond.notify_all()
