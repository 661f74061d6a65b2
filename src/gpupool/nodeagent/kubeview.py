"""The node agent's ``PodApi`` and ``InventoryApi`` on gpupool's one Kubernetes client."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpupool.kube.api import KubeApi
from gpupool.nodeagent.pods import Pod, pod_from_json


class KubePods:
    """Pods bound to a node, read fresh; annotations written with a resourceVersion precondition."""

    def __init__(self, api: KubeApi):
        self.api = api

    def node_pods(self, node: str) -> list[Pod]:
        return [pod_from_json(p.to_dict()) for p in self.api.list_pods(node).items]

    def patch_annotations(self, pod: Pod, annotations: Mapping[str, str]) -> Pod:
        new = self.api.patch_pod_annotations(pod.namespace, pod.name, dict(annotations),
                                             pod.resource_version)
        return pod_from_json(new.to_dict())


class KubeInventory:
    """This node's ``GPUDevice`` objects."""

    def __init__(self, api: KubeApi):
        self.api = api

    def list_devices(self, node: str) -> list[dict[str, Any]]:
        return [dict(o) for o in self.api.list_gpu_devices(node).items]

    def create_device(self, body: Mapping[str, Any]) -> None:
        self.api.create_gpu_device(body)

    def replace_device(self, body: Mapping[str, Any]) -> None:
        self.api.update_gpu_device(body)

    def update_device_status(self, name: str, status: Mapping[str, Any]) -> None:
        self.api.patch_gpu_device_status(name, status)

    def delete_device(self, name: str) -> None:
        self.api.delete_gpu_device(name)
