"""A placement decision as a value: the node, CPU, memory and per-GPU slices.

A *remote* allocation (``served_by`` set) holds the pod's CPU and memory on ``node``, the
node the pod runs on, and its GPU slices on ``served_by``, the node whose slice server
serves them (``core.serving``; docs/design/remote.md). ``served_by`` may equal ``node``: a
slice server beside the pod, on its own node's GPU.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Slice:
    """What one container holds of one GPU (memory already rounded to whole units).

    ``memory_mib`` and ``core_pct`` are what it is granted (the state and quotas count
    them); ``burst_memory_mib`` and ``burst_core_pct`` what it may use above them while
    the GPU has room (a burstable slice; docs/design/burst.md)."""

    gpu_uuid: str
    gpu_position: int
    memory_mib: int
    core_pct: int
    container: str = ""
    burst_memory_mib: int = 0
    burst_core_pct: int = 0

    @property
    def memory_limit_mib(self) -> int:
        """The most GPU memory the container may use (its request plus its burst)."""
        return self.memory_mib + self.burst_memory_mib

    @property
    def core_limit_pct(self) -> int:
        """The largest compute share the container may use (request plus burst)."""
        return self.core_pct + self.burst_core_pct


@dataclass(frozen=True, slots=True)
class Allocation:
    """Everything a pod holds. ``key`` is the pod's allocation id; CPU and memory are on
    ``node``, the slices on ``gpu_node`` (``node`` unless a slice server serves them)."""

    key: str
    node: str
    cpu_milli: int
    memory_mib: int
    slices: tuple[Slice, ...] = ()
    exclusive: bool = False
    served_by: str = ""
    """The node whose slice server serves the slices ("": the pod's own node's devices)."""

    @property
    def remote(self) -> bool:
        """Served by a slice server rather than by the node's own devices."""
        return bool(self.served_by)

    @property
    def gpu_node(self) -> str:
        """The node whose GPUs the slices are on."""
        return self.served_by or self.node

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes this allocation holds anything on (one, or two when served from
        another node)."""
        return (self.node,) if self.gpu_node == self.node else (self.node, self.gpu_node)

    def part_on(self, node: str) -> Allocation:
        """What this allocation holds on ``node`` alone, as a local allocation there (the
        whole of it when it holds everything there; nothing when it holds nothing there)."""
        if self.nodes == (node,):
            return self
        cpu, mem = (self.cpu_milli, self.memory_mib) if node == self.node else (0, 0)
        slices = self.slices if node == self.gpu_node else ()
        return Allocation(self.key, node, cpu, mem, slices, self.exclusive and bool(slices))

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
        served = f" served by {self.served_by}" if self.served_by else ""
        return (f"{self.key} on {self.node}: {self.cpu_milli}m CPU, {self.memory_mib} MiB, "
                f"{gpus}{served}")
