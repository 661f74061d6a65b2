"""FAKE kubelet: the one test seam in front of the real kubelet.

It serves what a kubelet serves to a device plugin — ``Registration`` on
``device-plugins/kubelet.sock`` and the read-only ``PodResources`` API on
``pod-resources/kubelet.sock`` — over real unix sockets in a temporary
directory, and drives the plugin the way kubelet does: after a registration it
calls GetDevicePluginOptions and keeps a ListAndWatch stream open; ``admit``
admits one pod: adds it to its pod manager (so PodResources lists it), then for
each GPU container in order picks free healthy devices (``rng`` or the
plugin's preferred allocation), calls Allocate, records the devices, and
finally calls PreStartContainer for each container. ``restart`` deletes every
socket in device-plugins/ and re-creates kubelet.sock, as kubelet does.

What a container then sees is kept as kubelet hands it to the runtime: its
environment is the plugin's variables with the container's own ``env`` over them
(kubelet lets the container's own win), plus the plugin's mounts and CDI devices.
``runtime_gpus`` says which GPUs the NVIDIA container toolkit exposes from that,
configured as docs/install.md asks (or, ``accept_envvar``, left at its defaults).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Mapping
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from gpupool.nodeagent.proto import deviceplugin_pb2 as dp
from gpupool.nodeagent.proto import deviceplugin_pb2_grpc as dp_grpc
from gpupool.nodeagent.proto import podresources_pb2 as pr
from gpupool.nodeagent.proto import podresources_pb2_grpc as pr_grpc
from tests.waiting import PATIENCE_S

RESOURCE = "gpupool.io/gpu"


@dataclass
class Update:
    """One ListAndWatch message as received: when, and the devices (id -> (health, numa))."""

    at: float
    devices: dict[str, tuple[str, int]]


@dataclass
class Admission:
    """What admitting one pod gave each GPU container."""

    envs: dict[str, dict[str, str]] = field(default_factory=dict)  # as the container sees it
    devices: dict[str, list[str]] = field(default_factory=dict)
    mounts: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    cdi: dict[str, list[str]] = field(default_factory=dict)
    read_only: dict[str, dict[str, bool]] = field(default_factory=dict)  # container path -> ro


DEVICE_LIST_ROOT = "/var/run/nvidia-container-devices"


def runtime_gpus(got: Admission, container: str, accept_envvar: bool = False) -> list[str]:
    """GPU uuids the NVIDIA container toolkit gives the (unprivileged) container: from
    ``/dev/null`` mounts under ``/var/run/nvidia-container-devices`` first
    (``accept-nvidia-visible-devices-as-volume-mounts = true``), else the CDI devices,
    else — only with ``accept_envvar`` (the toolkit's default) — ``NVIDIA_VISIBLE_DEVICES``
    as the container sees it."""
    mounted = [c[len(DEVICE_LIST_ROOT) + 1:] for c, h in got.mounts[container]
               if h == "/dev/null" and c.startswith(DEVICE_LIST_ROOT + "/")]
    if mounted:
        return sorted(mounted)
    if got.cdi[container]:
        return sorted(n.partition("=")[2] for n in got.cdi[container])
    value = got.envs[container].get("NVIDIA_VISIBLE_DEVICES", "") if accept_envvar else ""
    return sorted(v for v in value.split(",") if v and v not in ("void", "none"))


class _Registration(dp_grpc.RegistrationServicer):
    def __init__(self, kubelet: FakeKubelet):
        self.kubelet = kubelet

    def Register(self, request: Any, context: Any) -> Any:
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "unsupported version")
        self.kubelet._registered(request)
        return dp.Empty()


class _PodResources(pr_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: FakeKubelet):
        self.kubelet = kubelet

    def List(self, request: Any, context: Any) -> Any:
        with self.kubelet.lock:
            pods = []
            for ref, containers in self.kubelet.pod_manager.items():
                ns, name = ref.split("/", 1)
                cs = [pr.ContainerResources(name=c, devices=[
                    pr.ContainerDevices(resource_name=RESOURCE, device_ids=ids)] if ids else [])
                    for c, ids in containers.items()]
                pods.append(pr.PodResources(name=name, namespace=ns, containers=cs))
        return pr.ListPodResourcesResponse(pod_resources=pods)


class FakeKubelet:
    """FAKE kubelet over real unix sockets under ``root`` (see the module docstring)."""

    def __init__(self, root: Path, serve_pod_resources: bool = True):
        self.root = Path(root)
        self.plugin_dir = self.root / "device-plugins"
        self.pod_resources_dir = self.root / "pod-resources"
        self.serve_pod_resources = serve_pod_resources
        self.lock = threading.Condition()
        self.registrations: list[Any] = []
        self.updates: list[Update] = []
        self.options: Any = None
        self.pod_manager: dict[str, dict[str, list[str]]] = {}
        self.allocate_seconds: list[float] = []  # wall time of each Allocate call
        self._servers: list[grpc.Server] = []
        self._channel: grpc.Channel | None = None
        self._stream: Any = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> FakeKubelet:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.pod_resources_dir.mkdir(parents=True, exist_ok=True)
        reg = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        dp_grpc.add_RegistrationServicer_to_server(_Registration(self), reg)
        reg.add_insecure_port(f"unix://{self.plugin_dir / 'kubelet.sock'}")
        self._servers = [reg]
        if self.serve_pod_resources:
            res = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
            pr_grpc.add_PodResourcesListerServicer_to_server(_PodResources(self), res)
            res.add_insecure_port(f"unix://{self.pod_resources_dir / 'kubelet.sock'}")
            self._servers.append(res)
        for s in self._servers:
            s.start()
        return self

    def stop(self) -> None:
        for s in self._servers:
            s.stop(grace=0).wait(2)
        self._servers = []
        self._disconnect()
        for sock in list(self.plugin_dir.glob("*.sock")) + list(
                self.pod_resources_dir.glob("*.sock")):
            sock.unlink(missing_ok=True)

    def restart(self) -> None:
        """Kubelet restarts: every socket in device-plugins/ is removed, kubelet.sock re-created."""
        self.stop()
        self.start()

    def _disconnect(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    # -- the plugin side -----------------------------------------------------------------------
    def _registered(self, request: Any) -> None:
        with self.lock:
            self.registrations.append(request)
        threading.Thread(target=self._connect, args=(request.endpoint,), daemon=True).start()

    def _connect(self, endpoint: str) -> None:
        self._disconnect()
        channel = grpc.insecure_channel(f"unix://{self.plugin_dir / endpoint}")
        stub = dp_grpc.DevicePluginStub(channel)
        try:
            options = stub.GetDevicePluginOptions(dp.Empty(), timeout=PATIENCE_S)
        except grpc.RpcError:  # the plugin went away again; kubelet waits for a new Register
            channel.close()
            return
        stream = stub.ListAndWatch(dp.Empty())
        with self.lock:
            self._channel, self._stream, self.options = channel, stream, options
            self.lock.notify_all()
        try:
            for msg in stream:
                devices = {d.ID: (d.health, d.topology.nodes[0].ID if d.topology.nodes else -1)
                           for d in msg.devices}
                with self.lock:
                    self.updates.append(Update(time.monotonic(), devices))
                    self.lock.notify_all()
        except grpc.RpcError:
            return

    def stub(self) -> Any:
        with self.lock:
            self.lock.wait_for(lambda: self._channel is not None, PATIENCE_S)
            assert self._channel is not None, "the plugin never registered"
            return dp_grpc.DevicePluginStub(self._channel)

    def wait_registrations(self, n: int, timeout: float = PATIENCE_S) -> None:
        with self.lock:
            ok = self.lock.wait_for(lambda: len(self.registrations) >= n and self.updates, timeout)
        assert ok, f"expected {n} registrations, saw {len(self.registrations)}"

    def wait_update(self, predicate: Any, timeout: float = PATIENCE_S) -> Update:
        """The first ListAndWatch update (old or new) whose devices satisfy ``predicate``."""
        with self.lock:
            found: list[Update] = []

            def seen() -> bool:
                found[:] = [u for u in self.updates if predicate(u.devices)]
                return bool(found)

            assert self.lock.wait_for(seen, timeout), "no matching ListAndWatch update"
            return found[0]

    def devices(self) -> dict[str, tuple[str, int]]:
        with self.lock:
            return dict(self.updates[-1].devices) if self.updates else {}

    # -- admission ------------------------------------------------------------------------------
    def admit(self, pod: Mapping[str, Any], rng: random.Random | None = None,
              prefer: bool = False) -> Admission:
        """Admit ``pod`` as kubelet does; gRPC errors propagate (``grpc.RpcError``)."""
        meta, spec = pod["metadata"], pod["spec"]
        ref = f"{meta.get('namespace', 'default')}/{meta['name']}"
        gpu = [(c["name"], int(c["resources"]["limits"][RESOURCE]))
               for c in spec.get("initContainers", []) + spec["containers"]
               if RESOURCE in (c.get("resources") or {}).get("limits", {})]
        own = {c["name"]: {e["name"]: e.get("value", "") for e in c.get("env") or ()}
               for c in spec.get("initContainers", []) + spec["containers"]}
        with self.lock:
            self.pod_manager[ref] = {c: [] for c, _ in gpu}
        stub = self.stub()
        out = Admission()
        for name, count in gpu:
            ids = self._pick(stub, count, rng or random.Random(0), prefer)
            start = time.perf_counter()
            resp = stub.Allocate(dp.AllocateRequest(container_requests=[
                dp.ContainerAllocateRequest(devices_ids=ids)]), timeout=PATIENCE_S)
            self.allocate_seconds.append(time.perf_counter() - start)
            with self.lock:
                self.pod_manager[ref][name] = ids
            c = resp.container_responses[0]
            out.envs[name] = {**dict(c.envs), **own.get(name, {})}
            out.devices[name] = ids
            out.mounts[name] = [(m.container_path, m.host_path) for m in c.mounts]
            out.read_only[name] = {m.container_path: m.read_only for m in c.mounts}
            out.cdi[name] = [d.name for d in c.cdi_devices]
        for name, _ in gpu:
            stub.PreStartContainer(dp.PreStartContainerRequest(devices_ids=out.devices[name]),
                                   timeout=PATIENCE_S)
        return out

    def _pick(self, stub: Any, count: int, rng: random.Random, prefer: bool) -> list[str]:
        with self.lock:
            used = {i for cs in self.pod_manager.values() for ids in cs.values() for i in ids}
        free = sorted(i for i, (h, _) in self.devices().items() if h == "Healthy" and i not in used)
        if len(free) < count:
            raise RuntimeError(f"kubelet stand-in: {count} devices wanted, {len(free)} free")
        if not prefer:
            return rng.sample(free, count)
        resp = stub.GetPreferredAllocation(dp.PreferredAllocationRequest(container_requests=[
            dp.ContainerPreferredAllocationRequest(available_deviceIDs=free,
                                                   allocation_size=count)]), timeout=PATIENCE_S)
        return list(resp.container_responses[0].deviceIDs)

    def forget(self, ref: str) -> None:
        """The pod is gone: its devices are free again."""
        with self.lock:
            self.pod_manager.pop(ref, None)
