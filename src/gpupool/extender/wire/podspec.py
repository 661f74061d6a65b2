"""Pod JSON (as kube-scheduler sends it) -> ``PodRequest``: the extender's edge.

Per container, ``resources.limits`` (falling back to ``requests``) may carry

* ``gpupool.io/gpu``: N GPUs (alone: exclusive whole GPUs);
* ``gpupool.io/gpu-memory``: MiB of GPU memory per GPU (a whole number);
* ``gpupool.io/gpu-core``: percent of one GPU's compute per GPU (1..100);
* ``class.gpupool.io/<class>``: N GPUs of resource class ``<class>``;
* ``gpupool.io/remote-gpu``: N GPUs of a ``remote-required`` pod, served by slice servers.

Memory or core without a count means one GPU. ``gpupool.io/mode``
(``exclusive``|``shared``) overrides the default mode (shared when memory or
core is asked, else exclusive); ``gpupool.io/affinity`` is ``pod`` or
``least-loaded``; ``gpupool.io/placement`` says where the slices may be served; the label
``gpupool.io/group`` names the resource group. The
tenant is the pod's namespace. The pod's CPU and memory are the larger of the
sum over containers and the largest init container (requests, else limits).

Anything absurd raises ``InvalidInput`` with a sentence that names the pod, the
container and the value. The translation itself is ``gpupool.contract.podspec_request``
(shared with ``gpupool inspect`` and the controller); this module adds the pod's
identity, its priority (``spec.priority``, which the API server's Priority admission sets
from ``priorityClassName``: 0 without a class, as kube-scheduler reads an unset one) and
whether it may preempt (``spec.preemptionPolicy`` is not ``Never``), and the
resource-name test the extender needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.contract import names
from gpupool.contract.podspec_request import pod_request, pod_where

__all__ = ["PodId", "is_gpupool_resource", "may_preempt", "pod_id", "pod_priority",
           "pod_request"]


@dataclass(frozen=True, slots=True)
class PodId:
    """Who the pod is: uid (the allocation key), namespace and name."""

    uid: str
    namespace: str
    name: str

    @property
    def key(self) -> str:
        return self.uid or f"{self.namespace}/{self.name}"


def pod_id(pod: Mapping[str, Any]) -> PodId:
    ns, name, uid = pod_where(pod)
    return PodId(uid, ns, name)


def is_gpupool_resource(name: str) -> bool:
    return name in (names.RESOURCE_GPU, names.RESOURCE_MEMORY, names.RESOURCE_CORE) or \
        name.startswith(names.CLASS_RESOURCE_PREFIX)


INT32 = 2**31


def pod_priority(pod: Mapping[str, Any]) -> int:
    """``spec.priority``; 0 when unset (kube-scheduler's reading). A value that is not a
    32-bit integer (the API server never stores one) counts as 0 too."""
    spec = pod.get("spec")
    value = spec.get("priority") if isinstance(spec, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int) or not -INT32 <= value < INT32:
        return 0
    return value


def may_preempt(pod: Mapping[str, Any]) -> bool:
    """Whether the pod may preempt others (``spec.preemptionPolicy`` is not ``Never``)."""
    spec = pod.get("spec")
    return not (isinstance(spec, Mapping) and spec.get("preemptionPolicy") == "Never")
