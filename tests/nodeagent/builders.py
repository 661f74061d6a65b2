"""Small builders for node-agent tests: fake GPU files, pods, extender-style decisions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import waiting
import yaml

from gpupool.contract import annotations, names
from gpupool.core.allocation import Allocation, Slice
from gpupool.security.signing import SigningKeys, claims_of

NODE = "node-a"
BIND_TIME = "2026-01-01T00:00:00Z"
NAMESPACE = "gpupool-system"  # where the agent reads the decision keys
KEYS = SigningKeys().added(0.0)
"""The test cluster's decision signing key (what the extender signs with)."""


def wait_for(predicate: Callable[[], object], timeout: float = waiting.PATIENCE_S) -> None:
    """Wait until ``predicate()`` holds (the agent's watches run on threads of their own);
    fail the test if it does not within ``timeout`` seconds."""
    assert waiting.wait_for(predicate, timeout), "condition not reached"


def uuid_of(i: int) -> str:
    return f"GPU-{i:08d}-0000-4000-8000-{i:012d}"


def write_gpus(path: Path, count: int, memory_mib: int = 16384, numa_split: int = 2) -> Path:
    """A FAKE GPU file with ``count`` identical GPUs (the upper half on NUMA node 1)."""
    gpus = [{"uuid": uuid_of(i), "model": "A100-SXM4-80GB", "memoryMiB": memory_mib,
             "numaNode": (i * numa_split) // max(count, 1), "architecture": "ampere",
             "labels": {"nvlink": "true"}} for i in range(count)]
    path.write_text(yaml.safe_dump({"gpus": gpus}, sort_keys=False))
    return path


Container = tuple[str, int, int, int]
"""(name, gpupool.io/gpu, gpu-memory MiB, gpu-core %)"""


def pod(name: str, containers: Sequence[Container], node: str = NODE,
        ann: dict[str, str] | None = None, created: str = "2026-01-01T00:00:00Z",
        uid: str | None = None) -> dict[str, Any]:
    cs = []
    for cname, count, mem, core in containers:
        limits = {names.RESOURCE_GPU: str(count)}
        if mem:
            limits[names.RESOURCE_MEMORY] = str(mem)
        if core:
            limits[names.RESOURCE_CORE] = str(core)
        cs.append({"name": cname, "image": "cuda", "resources": {"limits": limits}})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": uid or f"uid-{name}",
                         "annotations": dict(ann or {}), "creationTimestamp": created},
            "spec": {"nodeName": node, "containers": cs}}


def decision(pod_name: str, slices: Sequence[tuple[str, int, int, int, str]],
             node: str = NODE, exclusive: bool = False, keys: SigningKeys | None = KEYS,
             uid: str | None = None, bursts: Sequence[tuple[int, int]] | None = None
             ) -> dict[str, str]:
    """Extender-style annotations, signed as the extender signs them at bind (``keys``
    None: unsigned); slices are (uuid, index, memory MiB, core %, container), ``bursts``
    per slice (memory MiB, core %) above the request."""
    extra = list(bursts or [(0, 0)] * len(slices))
    alloc = Allocation(uid or f"uid-{pod_name}", node, 1000, 1024,
                       tuple(Slice(u, i, m, c, n, *b)
                             for (u, i, m, c, n), b in zip(slices, extra, strict=True)),
                       exclusive)
    ann = annotations.encode(alloc, BIND_TIME)
    return sign(ann, pod_name, keys, uid) if keys is not None else ann


def sign(ann: dict[str, str], pod_name: str, keys: SigningKeys = KEYS,
         uid: str | None = None, namespace: str = "default") -> dict[str, str]:
    """``ann`` with the signature the extender would give it for that pod."""
    claims = claims_of(uid or f"uid-{pod_name}", namespace, pod_name, ann)
    return {**ann, names.ANNOTATION_SIGNATURE: keys.active(1e12).sign(claims)}


def fake_mps_control(directory: Path) -> Path:
    """An executable ``nvidia-cuda-mps-control`` in ``directory`` that runs the FAKE one."""
    import sys

    exe = directory / "nvidia-cuda-mps-control"
    script = Path(__file__).with_name("fake_mps_control.py")
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    exe.chmod(0o755)
    return exe


def mps_state(log_dir: Path) -> dict[str, Any]:
    """What the FAKE MPS control daemon holds (its ``fake-state.json``), {} before it ran."""
    import json

    path = log_dir / "fake-state.json"
    return dict(json.loads(path.read_text())) if path.exists() else {}


def pod_uid(n: int) -> str:
    """A pod UID as the API server makes them (kubelet's cgroup paths carry it)."""
    return f"{n:08x}-1d1b-4c3e-9a8f-5b9d2a6f7e01"


def container_id(n: int) -> str:
    return f"{n:064x}"


def cgroup_v2(uid: str, cid: str) -> str:
    """``/proc/<pid>/cgroup`` of a container under the systemd driver (cgroup v2)."""
    u = uid.replace("-", "_")
    return (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/"
            f"cri-containerd-{cid}.scope\n")


def write_cgroup(proc_root: Path, pid: int, text: str) -> None:
    (proc_root / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc_root / str(pid) / "cgroup").write_text(text)


def running(obj: dict[str, Any], containers: dict[str, str]) -> dict[str, Any]:
    """The pod with status.containerStatuses naming each container's runtime id."""
    return {**obj, "status": {"phase": "Running", "containerStatuses": [
        {"name": n, "containerID": f"containerd://{cid}", "image": "cuda", "imageID": "",
         "ready": True, "restartCount": 0} for n, cid in containers.items()]}}
