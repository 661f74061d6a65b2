"""The Kubernetes calls that serve remote GPU slices (the controller's ``slicekeeper``).

In gpupool's namespace: server pods and Services created and deleted, the servers' TLS
Secrets listed, written and annotated, the revocation list's ConfigMap. In a workload's
namespace: the sidecar's TLS Secret written (created, or replaced whole) and deleted,
never read, owned by the workload's pod so that it goes with it. Failures raise
``gpupool.kube.errors`` like every other call.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.core_v1 import Pod, Secret, Service
from lightkube.types import PatchType

from gpupool.kube.api import KubeApi, KubeObject
from gpupool.kube.api import _translated as translated
from gpupool.kube.errors import AlreadyExists

KINDS: dict[str, Any] = {"Pod": Pod, "Service": Service, "Secret": Secret}


@dataclass(frozen=True, slots=True)
class SecretSeen:
    """A Secret's name, labels, annotations and data (base64-decoded to text)."""

    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    data: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Owner:
    """The object a written Secret belongs to (garbage collection deletes it with it)."""

    kind: str
    name: str
    uid: str


class SliceObjects:
    """Calls on ``api``'s client (thread-safe as the client is)."""

    def __init__(self, api: KubeApi):
        self.api = api

    def create(self, kind: str, obj: Mapping[str, Any]) -> None:
        """Create a Pod or Service (``AlreadyExists`` when its name is taken)."""
        meta = obj.get("metadata") or {}
        with translated(f"create {kind} {meta.get('namespace')}/{meta.get('name')}"):
            self.api.client.create(KINDS[kind].from_dict(dict(obj)))

    def delete(self, kind: str, namespace: str, name: str) -> None:
        with translated(f"delete {kind} {namespace}/{name}"):
            self.api.client.delete(KINDS[kind], name, namespace=namespace)

    def list_json(self, kind: str, namespace: str, labels: Mapping[str, Any]
                  ) -> list[KubeObject]:
        with translated(f"list {kind}s in {namespace}"):
            items = list(self.api.client.list(KINDS[kind], namespace=namespace,
                                              labels=dict(labels)))
        return [msgspec.to_builtins(o) for o in items]

    def secrets(self, namespace: str, labels: Mapping[str, Any]) -> list[SecretSeen]:
        out = []
        for obj in self.list_json("Secret", namespace, labels):
            meta = obj.get("metadata") or {}
            try:
                data = {k: base64.b64decode(v).decode() for k, v in
                        (obj.get("data") or {}).items()}
            except (ValueError, UnicodeDecodeError):
                data = {}
            out.append(SecretSeen(str(meta.get("name") or ""), meta.get("labels") or {},
                                  meta.get("annotations") or {}, data))
        return out

    def write_secret(self, namespace: str, name: str, data: Mapping[str, str], *,
                     labels: Mapping[str, str], annotations: Mapping[str, str] | None = None,
                     owner: Owner | None = None, secret_type: str = "kubernetes.io/tls"
                     ) -> None:
        """Create the Secret, or replace it whole when it exists (no read)."""
        refs = [OwnerReference(apiVersion="v1", kind=owner.kind, name=owner.name,
                               uid=owner.uid)] if owner is not None else None
        meta = ObjectMeta(name=name, namespace=namespace, labels=dict(labels),
                          annotations=dict(annotations) if annotations else None,
                          ownerReferences=refs)
        encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
        body = Secret(metadata=meta, data=encoded, type=secret_type)
        try:
            with translated(f"create Secret {namespace}/{name}"):
                self.api.client.create(body)
        except AlreadyExists:
            with translated(f"replace Secret {namespace}/{name}"):
                self.api.client.replace(body)

    def annotate_secret(self, namespace: str, name: str, annotations: Mapping[str, str]
                        ) -> None:
        with translated(f"annotate Secret {namespace}/{name}"):
            self.api.client.patch(Secret, name, {"metadata": {"annotations": dict(annotations)}},
                                  namespace=namespace, patch_type=PatchType.MERGE)
