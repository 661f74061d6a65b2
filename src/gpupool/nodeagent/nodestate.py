"""This node's GPUs as the core's ``ClusterState``, filled from the pods' decisions.

The node agent re-checks GPU slices only (CPU and memory are kubelet's to
admit), so allocations enter the state without their CPU and memory.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from gpupool.contract import names
from gpupool.core.allocation import Allocation
from gpupool.core.errors import GpupoolError
from gpupool.core.model import Node
from gpupool.core.state import ClusterState
from gpupool.nodeagent.gpu import GpuInfo
from gpupool.nodeagent.pods import Pod

log = logging.getLogger(__name__)


def gpu_only(alloc: Allocation) -> Allocation:
    """``alloc`` without its CPU and memory."""
    return Allocation(alloc.key, alloc.node, 0, 0, alloc.slices, alloc.exclusive)


def holds_gpus(pod: Pod) -> bool:
    """Does ``pod`` hold its decided GPUs now (served at least in part, or allocated)?

    A terminating pod (deletion requested) still runs, so it still holds them, as
    the extender counts it: until the pod is gone or Succeeded / Failed.
    """
    if not pod.active:
        return False
    phase = pod.annotations.get(names.ANNOTATION_PHASE)
    if phase == names.PHASE_FAILED:
        return False
    return phase == names.PHASE_ALLOCATED or bool(pod.served())


class NodeView:
    """This node's ``ClusterState``, kept between Allocates and brought up to date.

    ``state`` reserves every other pod that holds GPUs (unreadable decisions are
    logged and left out), releasing what changed since the last call; it starts
    afresh when the GPUs change (health, vanish).
    """

    def __init__(self, node: str, memory_unit_mib: int):
        self.node = node
        self.memory_unit_mib = memory_unit_mib
        self._gpus: tuple[GpuInfo, ...] = ()
        self._state: ClusterState | None = None

    def state(self, gpus: Sequence[GpuInfo], pods: Iterable[Pod], skip_uid: str
              ) -> ClusterState:
        if self._state is None or tuple(gpus) != self._gpus:
            self._gpus = tuple(gpus)
            node = Node(self.node, 0, 0, tuple(g.to_core() for g in self._gpus))
            self._state = ClusterState([node], self.memory_unit_mib)
        state, want = self._state, self._wanted(pods, skip_uid)
        for key, held in list(state.allocations.items()):
            if want.get(key) != held:
                state.release(key)
        for key, alloc in want.items():
            try:
                state.reserve(alloc)
            except GpupoolError as exc:
                log.warning("%s: its decision does not fit this node's state: %s", key, exc)
        return state

    def _wanted(self, pods: Iterable[Pod], skip_uid: str) -> dict[str, Allocation]:
        want = {}
        for pod in pods:
            if pod.uid == skip_uid or not holds_gpus(pod):
                continue
            try:
                decision = pod.decision()
            except GpupoolError as exc:
                log.warning("pod %s: %s", pod.ref, exc)
                continue
            if decision is not None and decision.allocation.node == self.node:
                want[pod.uid] = gpu_only(decision.allocation)
        return want


def held_devices(pods: Iterable[Pod], skip_uid: str) -> set[str]:
    """Logical devices the agent served to other pods that still hold GPUs."""
    held: set[str] = set()
    for pod in pods:
        if pod.uid == skip_uid:
            continue
        try:
            if holds_gpus(pod):
                held.update(i for m in pod.served().values() for i in m)
        except GpupoolError as exc:
            log.warning("pod %s: %s", pod.ref, exc)
    return held
