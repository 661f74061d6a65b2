"""The Kubernetes calls the controller needs beyond ``KubeApi``'s, on the same client.

``ControllerApi`` is a ``KubeApi`` that can also create, patch and delete
``ResourceClass`` objects, merge-patch the ``status`` of classes and groups,
and list pods as plain decoded JSON (the controller's pure reconcile reads
dicts, not lightkube models). Failures raise ``gpupool.kube.errors`` like every
other call.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import msgspec
from lightkube.types import PatchType

from gpupool.kube.api import (
    GPUDevice,
    KubeApi,
    KubeObject,
    Listing,
    ResourceClass,
    ResourceGroup,
    _name,
    versioned,
)
from gpupool.kube.api import _translated as translated


def pod_json(pod: Any) -> KubeObject:
    """A lightkube ``Pod`` (or an already plain dict) as decoded JSON."""
    if isinstance(pod, dict):
        return pod
    result: KubeObject = msgspec.to_builtins(pod)
    return result


class ControllerApi(KubeApi):
    """``KubeApi`` plus ResourceClass writes and status patches of classes and groups."""

    @classmethod
    def open(cls, kubeconfig: str | None = None, server: str | None = None,
             timeout_s: float = 10.0) -> ControllerApi:
        """``KubeApi.connect`` (kubeconfig, bare server URL, or in-cluster), typed."""
        api = cls.connect(kubeconfig, server, timeout_s)
        assert isinstance(api, ControllerApi)  # connect builds ``cls``
        return api

    def list_pods_json(self) -> Listing[KubeObject]:
        """Pods of every namespace as decoded JSON."""
        listing = self.list_pods()
        return Listing([pod_json(p) for p in listing.items], listing.resource_version)

    def watch_pods_json(self, resource_version: str, timeout_s: int | None = None
                        ) -> Iterator[tuple[str, KubeObject]]:
        for kind, pod in self.watch_pods(resource_version, timeout_s=timeout_s):
            yield kind, pod_json(pod)

    def create_resource_class(self, obj: Mapping[str, Any]) -> KubeObject:
        with translated(f"create ResourceClass {_name(obj)}"):
            return dict(self.client.create(ResourceClass.from_dict(dict(obj))))

    def patch_resource_class(self, name: str, patch: Mapping[str, Any],
                             resource_version: str | None) -> KubeObject:
        """Merge-patch a class; with ``resource_version`` only if it is still current."""
        with translated(f"update ResourceClass {name}"):
            return dict(self.client.patch(ResourceClass, name, versioned(patch, resource_version),
                                          patch_type=PatchType.MERGE))

    def delete_resource_class(self, name: str) -> None:
        with translated(f"delete ResourceClass {name}"):
            self.client.delete(ResourceClass, name)

    def patch_resource_class_status(self, name: str, patch: Mapping[str, Any]) -> KubeObject:
        """Merge-patch ``status`` (``None`` values delete keys)."""
        with translated(f"patch status of ResourceClass {name}"):
            return dict(self.client.patch(ResourceClass.Status, name, {"status": dict(patch)},
                                          patch_type=PatchType.MERGE))

    def patch_gpu_device_annotations(self, name: str, annotations: Mapping[str, str]
                                     ) -> KubeObject:
        """Merge-patch a GPUDevice's annotations (MIG layouts asked of its node agent)."""
        with translated(f"annotate GPUDevice {name}"):
            return dict(self.client.patch(GPUDevice, name,
                                          {"metadata": {"annotations": dict(annotations)}},
                                          patch_type=PatchType.MERGE))

    def patch_resource_group_status(self, name: str, patch: Mapping[str, Any]) -> KubeObject:
        with translated(f"patch status of ResourceGroup {name}"):
            return dict(self.client.patch(ResourceGroup.Status, name, {"status": dict(patch)},
                                          patch_type=PatchType.MERGE))
