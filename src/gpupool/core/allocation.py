"""A placement decision as a value: the node, CPU, memory and per-GPU slices."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Slice:
    """What one container holds of one GPU (memory already rounded to whole units)."""

    gpu_uuid: str
    gpu_position: int
    memory_mib: int
    core_pct: int
    container: str = ""


@dataclass(frozen=True, slots=True)
class Allocation:
    """Everything a pod holds on one node. ``key`` is the pod's allocation id."""

    key: str
    node: str
    cpu_milli: int
    memory_mib: int
    slices: tuple[Slice, ...] = ()
    exclusive: bool = False

    @property
    def gpu_uuids(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for s in self.slices:
            seen.setdefault(s.gpu_uuid, None)
        return tuple(seen)

    def describe(self) -> str:
        gpus = ", ".join(
            f"{s.gpu_uuid}[{s.memory_mib} MiB, {s.core_pct} %]" for s in self.slices
        )
        return f"{self.key} on {self.node}: {self.cpu_milli}m CPU, {self.memory_mib} MiB, {gpus}"
