"""The API calls of the DRA plugin: read claims and pods, write the node's ResourceSlice.

``DraCluster`` is the narrow protocol the preparer and the slice publisher use;
``KubeDraCluster`` implements it on ``gpupool.kube.api.DraApi``. Failures raise the
``gpupool.kube.errors`` tree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from gpupool.kube.api import DraApi
from gpupool.kube.errors import NotFound

Obj = dict[str, Any]


class ClaimSource(Protocol):
    def get_claim(self, namespace: str, name: str) -> Obj:
        """The ResourceClaim as the API server has it (``NotFound`` when it is gone)."""
        ...

    def get_pod(self, namespace: str, name: str) -> Obj | None:
        """The pod as decoded JSON, or None when it is gone."""
        ...


class SliceApi(Protocol):
    def list_resource_slices(self, node: str, driver: str) -> list[Obj]: ...

    def create_resource_slice(self, obj: Mapping[str, Any]) -> Obj: ...

    def replace_resource_slice(self, obj: Mapping[str, Any]) -> Obj: ...

    def delete_resource_slice(self, name: str) -> None: ...


class DraCluster(ClaimSource, SliceApi, Protocol):
    """Everything the DRA plugin asks of the API server."""


class KubeDraCluster:
    """``DraCluster`` over a ``DraApi`` connection."""

    def __init__(self, api: DraApi):
        self.api = api

    def get_claim(self, namespace: str, name: str) -> Obj:
        return self.api.get_resource_claim(namespace, name)

    def get_pod(self, namespace: str, name: str) -> Obj | None:
        try:
            return self.api.get_pod_json(namespace, name)
        except NotFound:
            return None

    def list_resource_slices(self, node: str, driver: str) -> list[Obj]:
        return self.api.list_resource_slices(node, driver)

    def create_resource_slice(self, obj: Mapping[str, Any]) -> Obj:
        return self.api.create_resource_slice(obj)

    def replace_resource_slice(self, obj: Mapping[str, Any]) -> Obj:
        return self.api.replace_resource_slice(obj)

    def delete_resource_slice(self, name: str) -> None:
        self.api.delete_resource_slice(name)
