"""FAKE kubelet, DRA side: the one test seam in front of the real kubelet's DRA manager.

Built from the same public protos as the plugin, over real unix sockets:

* ``discover`` is kubelet's plugin watcher: it finds a socket in ``plugins_registry/``,
  asks ``GetInfo``, checks what kubelet checks (type ``DRAPlugin``, a driver name, a
  service it speaks among ``supported_versions``, v1 preferred), connects to the
  announced endpoint and reports ``NotifyRegistrationStatus``;
* ``prepare`` / ``unprepare`` call ``NodePrepareResources`` / ``NodeUnprepareResources``
  with claims named by namespace, name and uid, as kubelet does before a pod's
  containers start and after it is gone;
* ``container_edits`` resolves the CDI device IDs of an answer the way a CDI-enabled
  container runtime does: it reads the spec files in the CDI directory and merges the
  named devices' environment and mounts (CDI's variables replace the container's own).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from gpupool.nodeagent.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
)
from gpupool.nodeagent.proto import pluginregistration_pb2 as reg
from gpupool.nodeagent.proto import pluginregistration_pb2_grpc as reg_grpc
from tests.waiting import PATIENCE_S

KNOWN_SERVICES = {"v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc),
                  "v1beta1.DRAPlugin": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)}

Claim = tuple[str, str, str]
"""(namespace, name, uid)"""


@dataclass
class Prepared:
    """One claim's answer: devices as (request names, pool, device, CDI ids), or error."""

    devices: list[tuple[tuple[str, ...], str, str, tuple[str, ...]]] = field(default_factory=list)
    error: str = ""

    @property
    def cdi_ids(self) -> list[str]:
        return [i for d in self.devices for i in d[3]]


class FakeDraKubelet:
    def __init__(self, kubelet_dir: Path, services: Iterable[str] = tuple(KNOWN_SERVICES)):
        self.registry = Path(kubelet_dir) / "plugins_registry"
        self.services = tuple(services)  # what this kubelet speaks, most preferred first
        self.info: Any = None
        self.service = ""
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self._pb: Any = None

    def discover(self, timeout_s: float = PATIENCE_S, accept: bool = True) -> Any:
        """Register the plugin whose socket appears in plugins_registry/; its PluginInfo."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            socks = sorted(self.registry.glob("*.sock")) if self.registry.is_dir() else []
            if socks:
                return self._register(socks[0], accept)
            time.sleep(0.02)
        raise AssertionError(f"no plugin socket appeared in {self.registry}")

    def _register(self, sock: Path, accept: bool) -> Any:
        with grpc.insecure_channel(f"unix://{sock}") as channel:
            stub = reg_grpc.RegistrationStub(channel)
            info = stub.GetInfo(reg.InfoRequest(), timeout=PATIENCE_S)
            error = self._validate(info)
            ok = accept and not error
            stub.NotifyRegistrationStatus(reg.RegistrationStatus(
                plugin_registered=ok, error=error or ("" if accept else "refused by test")),
                timeout=PATIENCE_S)
        if ok:
            self.info = info
            self.connect()
        return info

    def _validate(self, info: Any) -> str:
        if info.type != "DRAPlugin":
            return f"plugin type {info.type!r} is not DRAPlugin"
        if not info.name:
            return "no driver name"
        chosen = [s for s in self.services if s in info.supported_versions]
        if not chosen:
            return f"none of the services {list(info.supported_versions)} is supported"
        self.service = chosen[0]
        return ""

    def connect(self) -> None:
        """(Re)open the connection to the announced endpoint."""
        self.close()
        pb, pb_grpc = KNOWN_SERVICES[self.service]
        self._channel = grpc.insecure_channel(f"unix://{self.info.endpoint}")
        self._stub = pb_grpc.DRAPluginStub(self._channel)
        self._pb = pb

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def _claims(self, claims: Iterable[Claim]) -> list[Any]:
        return [self._pb.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]

    def prepare(self, *claims: Claim) -> dict[str, Prepared]:
        answer = self._stub.NodePrepareResources(
            self._pb.NodePrepareResourcesRequest(claims=self._claims(claims)), timeout=PATIENCE_S)
        return {uid: Prepared([(tuple(d.request_names), d.pool_name, d.device_name,
                                tuple(d.cdi_device_ids)) for d in r.devices], r.error)
                for uid, r in answer.claims.items()}

    def unprepare(self, *claims: Claim) -> dict[str, str]:
        answer = self._stub.NodeUnprepareResources(
            self._pb.NodeUnprepareResourcesRequest(claims=self._claims(claims)), timeout=PATIENCE_S)
        return {uid: r.error for uid, r in answer.claims.items()}


def container_edits(cdi_dir: Path, cdi_ids: Iterable[str], own_env: Mapping[str, str]
                    ) -> tuple[dict[str, str], list[dict[str, Any]], list[str]]:
    """What a CDI-enabled runtime gives a container: (environment, mounts, the CDI ids it
    could not resolve in ``cdi_dir`` — another vendor's, e.g. ``nvidia.com/gpu``)."""
    specs = {}
    for path in Path(cdi_dir).glob("*.json"):
        spec = json.loads(path.read_text())
        for device in spec["devices"]:
            specs[f"{spec['kind']}={device['name']}"] = device["containerEdits"]
    env, mounts, foreign = dict(own_env), [], []
    for cdi_id in cdi_ids:
        edits = specs.get(cdi_id)
        if edits is None:
            foreign.append(cdi_id)
            continue
        env.update(dict(e.split("=", 1) for e in edits.get("env", [])))
        mounts.extend(edits.get("mounts", []))
    return env, mounts, foreign
