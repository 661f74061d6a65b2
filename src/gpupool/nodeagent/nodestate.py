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


def node_state(node: str, gpus: Sequence[GpuInfo], pods: Iterable[Pod], skip_uid: str,
               memory_unit_mib: int) -> ClusterState:
    """The node with every other pod that holds GPUs reserved (unreadable ones are logged)."""
    state = ClusterState([Node(node, 0, 0, tuple(g.to_core() for g in gpus))], memory_unit_mib)
    for pod in pods:
        if pod.uid == skip_uid or not holds_gpus(pod):
            continue
        try:
            decision = pod.decision()
            if decision is not None and decision.allocation.node == node:
                state.reserve(gpu_only(decision.allocation))
        except GpupoolError as exc:
            log.warning("pod %s: its decision does not fit this node's state: %s", pod.ref, exc)
    return state


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
