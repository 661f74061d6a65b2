"""Kubelet's PodResources API (read-only): which pod holds which device IDs.

Kubelet adds a pod to its pod manager before it admits it, and records each
container's devices right after the plugin's Allocate answers, so during an
Allocate the pod being admitted is listed with its GPU containers not yet
holding devices. ``holders`` returns None when the socket cannot be reached;
callers then fall back to guessing (see ``handshake``).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import grpc

from gpupool.nodeagent.proto import podresources_pb2, podresources_pb2_grpc

pb: Any = podresources_pb2  # generated code is not type-checked
pb_grpc: Any = podresources_pb2_grpc

log = logging.getLogger(__name__)

Holders = dict[str, dict[str, tuple[str, ...]]]
"""``namespace/name`` -> container -> device IDs of one resource."""


class PodResourcesClient:
    """Lists the device IDs of ``resource`` per pod and container."""

    def __init__(self, socket_path: Path, resource: str, timeout_s: float = 2.0):
        self.socket_path = Path(socket_path)
        self.resource = resource
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None

    def holders(self) -> Holders | None:
        """Kubelet's current view, or None if the API cannot be reached."""
        try:
            reply = self._stub().List(pb.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.RpcError as exc:
            log.warning("PodResources API at %s unavailable: %s", self.socket_path, exc.code())
            self.close()
            return None
        out: Holders = {}
        for pod in reply.pod_resources:
            containers = {c.name: tuple(i for d in c.devices if d.resource_name == self.resource
                                        for i in d.device_ids) for c in pod.containers}
            out[f"{pod.namespace}/{pod.name}"] = containers
        return out

    def _stub(self) -> Any:
        with self._lock:
            if self._channel is None:
                self._channel = grpc.insecure_channel(f"unix://{self.socket_path}")
            return pb_grpc.PodResourcesListerStub(self._channel)

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None
