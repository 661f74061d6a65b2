"""The gRPC side: the DevicePlugin service on our socket, registration with kubelet.

``DevicePluginService`` translates protobuf messages to calls on the
``LogicalPool`` and the ``Allocator`` and back; a refusal becomes a gRPC
``FAILED_PRECONDITION`` whose message names the pod and the reason.
``PluginSocket`` serves it on ``<kubelet-dir>/device-plugins/gpupool.sock``;
``register`` announces it to kubelet over ``kubelet.sock``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from gpupool.contract import names
from gpupool.core.errors import GpupoolError
from gpupool.nodeagent.allocator import Allocator
from gpupool.nodeagent.envs import ContainerAnswer
from gpupool.nodeagent.logical import LogicalPool
from gpupool.nodeagent.metrics import NodeMetrics
from gpupool.nodeagent.proto import deviceplugin_pb2, deviceplugin_pb2_grpc
from gpupool.nodeagent.unixserver import UnixServer

pb: Any = deviceplugin_pb2  # generated code is not type-checked
pb_grpc: Any = deviceplugin_pb2_grpc
log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
SOCKET_NAME = "gpupool.sock"
KUBELET_SOCKET = "kubelet.sock"


def plugin_options() -> Any:
    return pb.DevicePluginOptions(pre_start_required=True,
                                  get_preferred_allocation_available=True)


class DevicePluginService(pb_grpc.DevicePluginServicer):  # type: ignore[misc]
    """The v1beta1 DevicePlugin service over a ``LogicalPool`` and an ``Allocator``."""

    def __init__(self, pool: LogicalPool, allocator: Allocator, stopping: threading.Event,
                 metrics: NodeMetrics | None = None):
        self.pool = pool
        self.allocator = allocator
        self.stopping = stopping
        self.metrics = metrics

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return plugin_options()

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
        seen = -1
        while not self.stopping.is_set() and context.is_active():
            version = self.pool.version
            if version != seen:
                seen = version
                yield device_list(self.pool)
            self.pool.wait_change(seen, 0.25)

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        out = []
        for c in request.container_requests:
            ids = self.allocator.preferred(list(c.available_deviceIDs),
                                           list(c.must_include_deviceIDs), c.allocation_size)
            out.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return pb.PreferredAllocationResponse(container_responses=out)

    def Allocate(self, request: Any, context: Any) -> Any:
        out = []
        for c in request.container_requests:
            start = time.perf_counter()
            try:
                out.append(container_response(self.allocator.allocate(list(c.devices_ids))))
            except GpupoolError as exc:
                log.warning("Allocate %s refused: %s", list(c.devices_ids), exc)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            if self.metrics is not None:
                self.metrics.allocate_seconds.observe(time.perf_counter() - start)
                self.metrics.allocations.inc()
        return pb.AllocateResponse(container_responses=out)

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        try:
            self.allocator.verify(list(request.devices_ids))
        except GpupoolError as exc:
            log.error("PreStartContainer %s refused: %s", list(request.devices_ids), exc)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return pb.PreStartContainerResponse()


def device_list(pool: LogicalPool) -> Any:
    devices = [pb.Device(ID=d.id, health=d.health,
                         topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=d.numa_node)]))
               for d in pool.devices()]
    return pb.ListAndWatchResponse(devices=devices)


def container_response(answer: ContainerAnswer) -> Any:
    mounts = [pb.Mount(container_path=m.container_path, host_path=m.host_path,
                       read_only=m.read_only) for m in answer.mounts]
    cdi = [pb.CDIDevice(name=n) for n in answer.cdi_devices]
    return pb.ContainerAllocateResponse(envs=answer.envs, mounts=mounts, cdi_devices=cdi)


class PluginSocket(UnixServer):
    """The device plugin's gRPC server on ``<kubelet-dir>/device-plugins/gpupool.sock``;
    restartable (kubelet deletes the socket when it restarts)."""

    def __init__(self, directory: Path, service: DevicePluginService, workers: int = 8):
        self.service = service
        super().__init__(Path(directory) / SOCKET_NAME,
                         lambda server: pb_grpc.add_DevicePluginServicer_to_server(service, server),
                         workers, name="device-plugin")


def register(kubelet_socket: Path, resource: str = names.RESOURCE_GPU,
             timeout_s: float = 5.0) -> None:
    """Announce our socket to kubelet; raises ``grpc.RpcError`` if kubelet refuses."""
    with grpc.insecure_channel(f"unix://{kubelet_socket}") as channel:
        stub = pb_grpc.RegistrationStub(channel)
        stub.Register(pb.RegisterRequest(version=API_VERSION, endpoint=SOCKET_NAME,
                                         resource_name=resource, options=plugin_options()),
                      timeout=timeout_s)

