"""The narrow view of the Kubernetes API the node agent needs.

``kubeview`` implements it on ``gpupool.kube.api.KubeApi``; failures raise the
``gpupool.kube.errors`` tree (``Conflict`` when a precondition fails).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from gpupool.nodeagent.pods import Pod


class PodApi(Protocol):
    """Pods bound to this node, and compare-and-swap writes of their annotations."""

    def node_pods(self, node: str, fresh: bool = True) -> list[Pod]:
        """Every pod bound to ``node``: read from the API server, or (``fresh=False``) from
        a watch-fed cache when there is one. The cache may lag, never run ahead."""
        ...

    def patch_annotations(self, pod: Pod, annotations: Mapping[str, str | None]) -> Pod:
        """Merge ``annotations`` (None removes a key) into ``pod`` if it is still at
        ``pod.resource_version``.

        Raises ``gpupool.kube.errors.Conflict`` (nothing written) when the pod changed.
        """
        ...


class InventoryApi(Protocol):
    """The cluster-scoped ``GPUDevice`` objects of this node."""

    def list_devices(self, node: str) -> list[dict[str, Any]]: ...

    def create_device(self, body: Mapping[str, Any]) -> None: ...

    def replace_device(self, body: Mapping[str, Any]) -> None: ...

    def update_device_status(self, name: str, status: Mapping[str, Any]) -> None: ...

    def delete_device(self, name: str) -> None: ...


class EventApi(Protocol):
    """Kubernetes Events about pods (``kubectl describe pod`` shows them)."""

    def pod_event(self, pod: Pod, reason: str, message: str, warning: bool = True) -> None:
        """Record an Event; failures are logged, never raised (an Event is a report)."""
        ...


class EvictionApi(Protocol):
    """The Eviction API (policy/v1): evictions honour PodDisruptionBudgets."""

    def evict(self, pod: Pod) -> None:
        """Ask for the pod's eviction; ``gpupool.kube.errors.KubeError`` (code 429 while a
        PodDisruptionBudget allows no disruption) when refused."""
        ...
