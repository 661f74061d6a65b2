"""The objects that serve one remote GPU slice, as the controller makes them (pure).

* the **server pod** ``gpupool-slice-<slice>-<n>`` in the slices' namespace (the
  controller's alone: ``gpupool-slices`` by default), bound to the
  decided node (``spec.nodeName``: no scheduler), running ``gpupool slice-server`` pinned
  to the decided GPU (``NVIDIA_VISIBLE_DEVICES=<uuid>`` for the NVIDIA container runtime;
  the slice server gives its provider ``CUDA_VISIBLE_DEVICES``) with the slice's memory
  and compute and the isolation provider the GPU's node agent reports
  (``status.isolationProvider`` of its GPUDevice: MPS gets the GPU's MPS directories,
  HAMi-core its library), its TLS Secret and the revocation list mounted read-only;
  ``restartPolicy: Never``: a server that ends is replaced by the controller, which
  decides whether on the same GPU;
* the **Service** ``gpupool-slice-<slice>`` selecting the slice's server pod, the
  sidecar's address.

Both carry the labels ``gpupool.io/slice`` and ``gpupool.io/pod-uid`` that tie them to the
workload's pod, and the component label ``slice-server``. The tenant has no access to
either: the slices' namespace is gpupool's, which tenants cannot exec into or read, and
holds nothing but slices (the controller, which makes pods there, can read only what a
pod there can mount).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gpupool.contract import slices
from gpupool.core.allocation import Allocation, Slice

Obj = dict[str, Any]
REVOCATIONS = "gpupool-slice-revocations"  # ConfigMap: crl.pem (and revoked.json)
REVOCATIONS_DIR = "/var/run/gpupool/revocations"
LOOPBACK_PORT = 14833
ANNOTATION_SERVES = "gpupool.io/serves"  # on the server pod: the workload pod, ns/name
ANNOTATION_GPU = "gpupool.io/gpu"  # on the server pod: the decided GPU's uuid
ANNOTATION_SPEC = "gpupool.io/slice-spec"  # on the server pod: the slice, for the node agent


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """How a cluster runs its slice servers (chart values, through controller flags)."""

    provider: str = "none"  # contract.slices.PROVIDERS
    namespace: str = "gpupool-slices"  # the slices' own: servers, Services, Secrets, CA
    image: str = ""  # the server container's image (LUPINE: its image with gpupool added)
    provider_command: str = ""  # lupine: the server binary, with {port}
    provider_env: tuple[str, ...] = ()  # lupine: NAME=VALUE, e.g. SCUDA_PORT={port}
    cpu: str = "100m"
    memory: str = "128Mi"
    mps_root: str = "/run/gpupool/mps"  # the node agent's --mps-root
    hami_core_library: str = "/usr/local/vgpu/libvgpu.so"
    connect_deadline_s: float = 300.0
    heartbeat_s: float = 5.0
    heartbeat_deadline_s: float = 20.0


@dataclass(frozen=True, slots=True)
class Served:
    """One remote slice to serve: the workload pod and its decided slice."""

    uid: str
    namespace: str
    name: str
    slice_name: str
    allocation: Allocation

    @property
    def piece(self) -> Slice:
        return self.allocation.slices[0]  # one GPU per remote pod (contract.podspec_request)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def labels(slice_name: str, uid: str) -> dict[str, str]:
    return {slices.LABEL_COMPONENT: slices.COMPONENT, "app.kubernetes.io/part-of": "gpupool",
            slices.LABEL_SLICE: slice_name, slices.LABEL_POD_UID: uid}


def server_args(s: Served, settings: ServerSettings, isolation: str) -> list[str]:
    """``gpupool slice-server``'s arguments for slice ``s`` on a GPU whose node enforces
    slices with ``isolation`` (mps, hami-core, none)."""
    piece = s.piece
    args = [f"--pod-uid={s.uid}", f"--pod-name={s.ref}", f"--container={piece.container}",
            f"--gpu-uuid={piece.gpu_uuid}", f"--memory-mib={piece.memory_limit_mib}",
            f"--core-pct={piece.core_limit_pct}",
            f"--credentials-dir={slices.CREDENTIALS_DIR}",
            f"--revocations={REVOCATIONS_DIR}/crl.pem",
            f"--port={slices.SERVER_PORT}", f"--status-port={slices.SERVER_STATUS_PORT}",
            f"--loopback-port={LOOPBACK_PORT}",
            f"--connect-deadline-seconds={settings.connect_deadline_s:g}",
            f"--heartbeat-seconds={settings.heartbeat_s:g}",
            f"--heartbeat-deadline-seconds={settings.heartbeat_deadline_s:g}",
            f"--isolation-provider={isolation}"]
    if s.allocation.exclusive:
        args.append("--exclusive")
    if isolation == "mps":
        args.append("--mps-pipe-directory=/tmp/nvidia-mps")
    elif isolation == "hami-core":
        args.append(f"--hami-core-library={settings.hami_core_library}")
    if settings.provider == "lupine":
        args += ["--provider=command",
                 f"--provider-command={settings.provider_command}",
                 *(f"--provider-env={e}" for e in settings.provider_env),
                 "--allow-exposed-provider"]  # gpupool's NetworkPolicy admits the TLS port only
    else:
        args.append("--provider=stub")
    return args


def server_pod(s: Served, generation: int, settings: ServerSettings, isolation: str) -> Obj:
    """Server pod number ``generation`` of slice ``s``."""
    volumes: list[Obj] = [
        {"name": "credentials", "secret": {"secretName": slices.server_secret(s.slice_name)}},
        {"name": "revocations", "configMap": {"name": REVOCATIONS}}]
    mounts: list[Obj] = [
        {"name": "credentials", "mountPath": slices.CREDENTIALS_DIR, "readOnly": True},
        {"name": "revocations", "mountPath": REVOCATIONS_DIR, "readOnly": True}]
    extra_volumes, extra_mounts = _isolation_mounts(s.piece.gpu_uuid, settings, isolation)
    probe = {"httpGet": {"path": "/healthz", "port": slices.SERVER_STATUS_PORT},
             "periodSeconds": 5, "failureThreshold": 2}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": slices.server_pod(s.slice_name, generation),
                     "namespace": settings.namespace,
                     "labels": labels(s.slice_name, s.uid),
                     "annotations": {ANNOTATION_SERVES: s.ref,
                                     ANNOTATION_GPU: s.piece.gpu_uuid,
                                     ANNOTATION_SPEC: spec_of(s)}},
        "spec": {
            "nodeName": s.allocation.gpu_node, "restartPolicy": "Never",
            "automountServiceAccountToken": False, "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 10,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "server", "image": settings.image,
                "command": ["gpupool", "slice-server"],
                "args": server_args(s, settings, isolation),
                "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": s.piece.gpu_uuid}],
                "ports": [{"name": "tls", "containerPort": slices.SERVER_PORT},
                          {"name": "status", "containerPort": slices.SERVER_STATUS_PORT}],
                "readinessProbe": probe,
                "resources": {"requests": {"cpu": settings.cpu, "memory": settings.memory},
                              "limits": {"memory": settings.memory}},
                "volumeMounts": mounts + extra_mounts,
                "securityContext": {"allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
            "volumes": volumes + extra_volumes,
        },
    }


def spec_of(s: Served) -> str:
    """``gpupool.io/slice-spec``: what the node agent's over-use monitor needs of the slice
    (``nodeagent.slices``): the workload pod, its container, the GPU, the limits the server
    enforces and how much of them is burst (above the request: reclaimed first)."""
    return json.dumps({"uid": s.uid, "pod": s.ref, "container": s.piece.container,
                       "gpu": s.piece.gpu_uuid, "memoryMiB": s.piece.memory_limit_mib,
                       "corePct": s.piece.core_limit_pct,
                       "burstMemoryMiB": s.piece.burst_memory_mib,
                       "burstCorePct": s.piece.burst_core_pct,
                       "exclusive": s.allocation.exclusive}, sort_keys=True,
                      separators=(",", ":"))


def service(slice_name: str, uid: str, namespace: str) -> Obj:
    """The slice's Service: the sidecar's address, whichever server pod serves now."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": slices.service_name(slice_name), "namespace": namespace,
                         "labels": labels(slice_name, uid)},
            "spec": {"selector": {slices.LABEL_SLICE: slice_name,
                                  slices.LABEL_POD_UID: uid},
                     "ports": [{"name": "tls", "port": slices.SERVER_PORT,
                                "targetPort": slices.SERVER_PORT, "protocol": "TCP"}]}}


def _isolation_mounts(uuid: str, settings: ServerSettings, isolation: str
                      ) -> tuple[list[Obj], list[Obj]]:
    """The host paths the node's isolation provider needs in the server (those the node
    agent gives local containers): the GPU's MPS pipe and log directories, or HAMi-core's
    library."""
    paths: tuple[tuple[str, str, str, bool], ...]
    if isolation == "mps":
        root = settings.mps_root.rstrip("/")
        paths = (("mps-pipe", f"{root}/{uuid}/pipe", "/tmp/nvidia-mps", False),
                 ("mps-log", f"{root}/{uuid}/log", "/var/log/nvidia-mps", True),
                 ("mps-shm", f"{root}/shm", "/dev/shm", False))
    elif isolation == "hami-core":
        lib = settings.hami_core_library
        paths = (("hami-core", lib, lib, True),)
    else:
        return [], []
    return ([{"name": n, "hostPath": {"path": host}} for n, host, _, _ in paths],
            [{"name": n, "mountPath": inside, "readOnly": ro} for n, _, inside, ro in paths])
