"""Pod JSON (as kube-scheduler sends it) -> ``PodRequest``: the extender's edge.

Per container, ``resources.limits`` (falling back to ``requests``) may carry

* ``gpupool.io/gpu``: N GPUs (alone: exclusive whole GPUs);
* ``gpupool.io/gpu-memory``: MiB of GPU memory per GPU (a whole number);
* ``gpupool.io/gpu-core``: percent of one GPU's compute per GPU (1..100);
* ``class.gpupool.io/<class>``: N GPUs of resource class ``<class>``.

Memory or core without a count means one GPU. ``gpupool.io/mode``
(``exclusive``|``shared``) overrides the default mode (shared when memory or
core is asked, else exclusive); ``gpupool.io/affinity`` is ``pod`` or
``least-loaded``; the label ``gpupool.io/group`` names the resource group. The
tenant is the pod's namespace. The pod's CPU and memory are the larger of the
sum over containers and the largest init container (requests, else limits).

Anything absurd raises ``InvalidInput`` with a sentence that names the pod, the
container and the value. The translation itself is ``gpupool.contract.podspec_request``
(shared with ``gpupool inspect`` and the controller); this module adds the pod's
identity and the resource-name test the extender needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.contract import names
from gpupool.contract.podspec_request import pod_request
from gpupool.core.errors import InvalidInput

__all__ = ["PodId", "is_gpupool_resource", "pod_id", "pod_request"]


@dataclass(frozen=True, slots=True)
class PodId:
    """Who the pod is: uid (the allocation key), namespace and name."""

    uid: str
    namespace: str
    name: str

    @property
    def key(self) -> str:
        return self.uid or f"{self.namespace}/{self.name}"


def _map(value: Any, what: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{what} must be an object, got {type(value).__name__}")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidInput(f"{what} must be a list, got {type(value).__name__}")
    return value


def pod_id(pod: Mapping[str, Any]) -> PodId:
    meta = _map(pod.get("metadata"), "pod metadata")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidInput("the pod has no metadata.name")
    ns = meta.get("namespace") or "default"
    uid = meta.get("uid") or ""
    if not isinstance(ns, str) or not isinstance(uid, str):
        raise InvalidInput(f"pod {name}: metadata.namespace and metadata.uid must be strings")
    return PodId(uid, ns, name)


def is_gpupool_resource(name: str) -> bool:
    return name in (names.RESOURCE_GPU, names.RESOURCE_MEMORY, names.RESOURCE_CORE) or \
        name.startswith(names.CLASS_RESOURCE_PREFIX)
