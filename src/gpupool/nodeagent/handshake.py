"""Which pod is kubelet allocating for? (Allocate carries no pod identity.)

Kubelet admits one pod at a time and allocates its containers in order; it
adds the pod to its pod manager *before* admission, so the PodResources API
lists the pod being admitted, with the GPU containers it has not allocated yet
holding no device IDs. Every pod admitted earlier holds devices for all its
GPU containers. So the pod being allocated is the one pod that is

* bound to this node, active, and known to kubelet (PodResources), and
* has a GPU container that holds no devices yet and that the agent has not
  recorded as served (``gpupool.io/devices``), the first such container
  asking for exactly as many devices as kubelet is allocating.

That set has one member while kubelet behaves as described. If PodResources
cannot be reached, the agent falls back to the oldest such pod among all pods
bound to the node (creation time, then name: kubelet's admission order within
one batch) and marks the match unconfirmed; PreStartContainer then verifies it
against PodResources before the container starts. See docs/node-agent.md.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpupool.contract import names
from gpupool.core.errors import GpupoolError
from gpupool.nodeagent.podresources import Holders
from gpupool.nodeagent.pods import GpuContainer, Pod

log = logging.getLogger(__name__)


class NotIdentified(GpupoolError):
    """No pod (or more than one) can be the one kubelet is allocating for."""


@dataclass(frozen=True, slots=True)
class Target:
    """The pod and container an Allocate serves; ``confirmed`` if PodResources proved it."""

    pod: Pod
    container: GpuContainer
    confirmed: bool


def next_container(pod: Pod, held: Mapping[str, Sequence[str]]) -> GpuContainer | None:
    """The pod's first GPU container that holds no devices and was not served yet."""
    served = pod.served()
    for c in pod.containers:
        if not held.get(c.name) and c.name not in served:
            return c
    return None


def identify(pods: Sequence[Pod], holders: Holders | None, count: int) -> Target:
    """The pod and container kubelet is allocating ``count`` devices for."""
    waiting = _waiting(pods, holders)
    matching = [(p, c) for p, c in waiting if c.count == count]
    if len(matching) == 1 or (matching and holders is None):
        pod, c = min(matching, key=lambda pc: (pc[0].created, pc[0].name))
        return Target(pod, c, holders is not None)
    if not matching:
        _explain_failed(pods, holders, count)
        broken = "; ".join(p.problem for p in pods if p.problem)
        raise NotIdentified(_none_message(waiting, holders, count)
                            + (f" (unreadable pods: {broken})" if broken else ""))
    refs = ", ".join(p.ref for p, _ in matching)
    log.error("kubelet lists several pods waiting for %d devices: %s", count, refs)
    raise NotIdentified(f"several pods known to kubelet wait for {count} {names.RESOURCE_GPU} "
                        f"devices ({refs}); refusing to guess")


def _waiting(pods: Sequence[Pod], holders: Holders | None) -> list[tuple[Pod, GpuContainer]]:
    out = []
    for pod in pods:
        if not pod.active or pod.deleting or not pod.containers:
            continue
        if _failed(pod):
            continue
        if holders is not None and pod.ref not in holders:
            continue
        c = next_container(pod, (holders or {}).get(pod.ref, {}))
        if c is not None:
            out.append((pod, c))
    return out


def _failed(pod: Pod) -> bool:
    return pod.annotations.get(names.ANNOTATION_PHASE) == names.PHASE_FAILED


def _explain_failed(pods: Sequence[Pod], holders: Holders | None, count: int) -> None:
    """Raise naming a waiting pod whose decision was already marked failed, if there is one."""
    for pod in pods:
        if not _failed(pod) or (holders is not None and pod.ref not in holders):
            continue
        c = next_container(pod, (holders or {}).get(pod.ref, {}))
        if c is not None and c.count == count:
            reason = pod.annotations.get(names.ANNOTATION_REASON) or "no reason recorded"
            raise NotIdentified(f"pod {pod.ref}: its decision was marked failed: {reason}")


def _none_message(waiting: Sequence[tuple[Pod, GpuContainer]], holders: Holders | None,
                   count: int) -> str:
    if not waiting:
        where = "known to kubelet" if holders is not None else "bound to this node"
        return (f"no pod {where} is waiting for {names.RESOURCE_GPU} devices "
                f"(kubelet asked for {count})")
    seen = ", ".join(f"{p.ref} container {c.name} wants {c.count}" for p, c in waiting)
    return f"kubelet asked for {count} {names.RESOURCE_GPU} devices but the waiting pods ask " \
           f"otherwise: {seen}"
