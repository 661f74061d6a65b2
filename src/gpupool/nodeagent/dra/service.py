"""The gRPC side of the DRA plugin: kubelet's registration handshake and DRAPlugin.

* ``RegistrationService`` (``pluginregistration.Registration``) on
  ``<kubelet-dir>/plugins_registry/gpu.gpupool.io-reg.sock``: kubelet's plugin watcher
  finds the socket, asks ``GetInfo`` (type ``DRAPlugin``, the driver name, the DRA
  socket, the services offered: ``v1.DRAPlugin`` and ``v1beta1.DRAPlugin``) and reports
  the outcome with ``NotifyRegistrationStatus``;
* ``DraService`` (``DRAPlugin`` of both API versions) on
  ``<kubelet-dir>/plugins/gpu.gpupool.io/dra.sock``: each claim of a request is prepared
  or unprepared on its own; a claim that cannot be is answered with its ``error`` (kubelet
  retries it), never by failing the whole call.
Both are served by ``nodeagent.unixserver.UnixServer``, as the device plugin is.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from gpupool.contract import dra
from gpupool.core.errors import GpupoolError
from gpupool.nodeagent.dra.preparer import Preparer
from gpupool.nodeagent.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)

log = logging.getLogger(__name__)
reg_pb: Any = pluginregistration_pb2  # generated code is not type-checked
reg_grpc: Any = pluginregistration_pb2_grpc
v1_grpc: Any = dra_v1_pb2_grpc
v1beta1_grpc: Any = dra_v1beta1_pb2_grpc
PLUGIN_TYPE = "DRAPlugin"
SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
"""What kubelet reads in ``supported_versions``: the DRA gRPC services we serve."""
REGISTRATION_SOCKET = f"{dra.DRIVER}-reg.sock"
DRA_SOCKET = "dra.sock"


class RegistrationService(reg_grpc.RegistrationServicer):  # type: ignore[misc]
    """The plugin-watcher handshake; remembers what kubelet said."""

    def __init__(self, endpoint: Path):
        self.endpoint = endpoint
        self.registered = threading.Event()
        self.error = ""
        self.notifications = 0

    def GetInfo(self, request: Any, context: Any) -> Any:
        return reg_pb.PluginInfo(type=PLUGIN_TYPE, name=dra.DRIVER, endpoint=str(self.endpoint),
                                 supported_versions=list(SERVICES))

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.notifications += 1
        self.error = request.error
        if request.plugin_registered:
            log.info("kubelet registered DRA driver %s", dra.DRIVER)
            self.registered.set()
        else:
            log.error("kubelet refused DRA driver %s: %s", dra.DRIVER, request.error)
            self.registered.clear()
        return reg_pb.RegistrationStatusResponse()


class DraService:
    """NodePrepareResources / NodeUnprepareResources over a ``Preparer``, for one API
    version's generated messages."""

    def __init__(self, preparer: Preparer, pb: Any,
                 observe: Callable[[float], None] | None = None):
        self.preparer = preparer
        self.pb = pb
        self.observe = observe

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        out = {}
        for c in request.claims:
            start = time.perf_counter()
            try:
                devices = self.preparer.prepare(c.namespace, c.name, c.uid)
                out[c.uid] = self.pb.NodePrepareResourceResponse(devices=[
                    self.pb.Device(request_names=[d.request], pool_name=d.pool,
                                   device_name=d.device, cdi_device_ids=list(d.cdi_ids))
                    for d in devices])
            except GpupoolError as exc:
                log.warning("prepare %s/%s (%s) refused: %s", c.namespace, c.name, c.uid, exc)
                out[c.uid] = self.pb.NodePrepareResourceResponse(error=str(exc))
            if self.observe is not None:
                self.observe(time.perf_counter() - start)
        return self.pb.NodePrepareResourcesResponse(claims=out)

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        out = {}
        for c in request.claims:
            try:
                self.preparer.unprepare(c.uid)
                out[c.uid] = self.pb.NodeUnprepareResourceResponse()
            except GpupoolError as exc:
                log.warning("unprepare %s/%s (%s) failed: %s", c.namespace, c.name, c.uid, exc)
                out[c.uid] = self.pb.NodeUnprepareResourceResponse(error=str(exc))
        return self.pb.NodeUnprepareResourcesResponse(claims=out)


class _V1(DraService, v1_grpc.DRAPluginServicer):  # type: ignore[misc]
    pass


class _V1beta1(DraService, v1beta1_grpc.DRAPluginServicer):  # type: ignore[misc]
    pass


def add_dra_services(server: grpc.Server, preparer: Preparer,
                     observe: Callable[[float], None] | None = None) -> None:
    """Both DRAPlugin versions on ``server``."""
    v1_grpc.add_DRAPluginServicer_to_server(_V1(preparer, dra_v1_pb2, observe), server)
    v1beta1_grpc.add_DRAPluginServicer_to_server(
        _V1beta1(preparer, dra_v1beta1_pb2, observe), server)
