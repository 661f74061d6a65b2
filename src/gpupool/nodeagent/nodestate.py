"""This node's GPUs as the core's ``ClusterState``, filled from the pods' decisions.

The node agent re-checks GPU slices only (CPU and memory are kubelet's to
admit), so allocations enter the state without their CPU and memory. Only decisions
that ``trusted`` accepts (``verify.DecisionGate``: signed by gpupool's scheduler for
that pod, on a pod that asks a GPU) count: a forged decision holds no GPU here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

from gpupool.contract import names
from gpupool.core.allocation import Allocation
from gpupool.core.errors import GpupoolError
from gpupool.core.model import Node
from gpupool.core.state import ClusterState
from gpupool.nodeagent.gpu import GpuInfo
from gpupool.nodeagent.pods import Pod

log = logging.getLogger(__name__)

Trust = Callable[[Pod], bool]
NO_GPU = ""
"""What ``gpupool.io/devices`` records for a logical device with no GPU of the node behind
it (the container's slice is served by a slice server)."""


def _any(pod: Pod) -> bool:
    return True


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

    def __init__(self, node: str, memory_unit_mib: int, trusted: Trust = _any):
        self.node = node
        self.memory_unit_mib = memory_unit_mib
        self.trusted = trusted
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
            if pod.uid == skip_uid or not holds_gpus(pod) or not self.trusted(pod):
                continue
            try:
                decision = pod.decision()
            except GpupoolError as exc:
                log.warning("pod %s: %s", pod.ref, exc)
                continue
            if decision is not None and decision.allocation.gpu_node == self.node:
                want[pod.uid] = gpu_only(decision.allocation)  # not slices served elsewhere
        return want


def held_devices(pods: Iterable[Pod], skip_uid: str, trusted: Trust = _any) -> set[str]:
    """Logical devices the agent served to other pods that still hold GPUs."""
    return {i for pod in pods if pod.uid != skip_uid
            for m in served_devices(pod, trusted).values() for i in m}


def floating_devices(pods: Iterable[Pod], skip_uid: str, trusted: Trust = _any) -> set[str]:
    """Those of ``held_devices`` recorded with no GPU behind them (``NO_GPU``: a container
    whose slice a slice server serves; ``LogicalPool.assign`` may trade them)."""
    return {i for pod in pods if pod.uid != skip_uid
            for m in served_devices(pod, trusted).values() for i, u in m.items() if u == NO_GPU}


def served_devices(pod: Pod, trusted: Trust = _any) -> dict[str, dict[str, str]]:
    """What ``pod`` holds of the logical devices by its ``gpupool.io/devices`` record, if it
    holds GPUs by a trusted decision: per container named in the decision, at most as many
    devices as the decision gives it (a record cannot claim more than was decided)."""
    if not holds_gpus(pod) or not trusted(pod):
        return {}
    key = (pod.uid, pod.annotations.get(names.ANNOTATION_DEVICES),
           pod.annotations.get(names.ANNOTATION_ALLOCATION))
    found = _CAPPED.get(key)
    if found is None:
        found = _capped(pod)
        if len(_CAPPED) >= 10_000:
            _CAPPED.clear()
        _CAPPED[key] = found
    return found


_CAPPED: dict[tuple[str, str | None, str | None], dict[str, dict[str, str]]] = {}
"""``served_devices``' answers by (uid, devices record, decision): an Allocate asks for
every pod on the node. Read only by callers."""


def _capped(pod: Pod) -> dict[str, dict[str, str]]:
    try:
        decision = pod.decision()
        served = pod.served()
    except GpupoolError as exc:
        log.warning("pod %s: %s", pod.ref, exc)
        return {}
    if decision is None:
        return {}
    out = {}
    for container, mapping in served.items():
        n = sum(1 for s in decision.allocation.slices if s.container == container)
        out[container] = dict(sorted(mapping.items())[:n])
    return out
