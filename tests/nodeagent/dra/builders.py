"""Builders for DRA tests: allocated ResourceClaims and the pods that use them, shaped as
kube-scheduler and the API server leave them (see ../shared/fixtures/dra-v1)."""

from __future__ import annotations

from typing import Any

from gpupool.contract import dra

from ..builders import NODE

NAMESPACE = "team-a"


def allocated_claim(name: str, devices: list[str], *, memory: str | None = None,
                    cores: str | None = None, node: str = NODE, pods: tuple[str, ...] = (),
                    uid: str | None = None) -> dict[str, Any]:
    """A claim for len(devices) GPUs, allocated on ``devices`` of ``node``'s pool; with
    ``memory``/``cores`` a shared slice of each (what was consumed), else whole GPUs."""
    asked = {k: v for k, v in (("memory", memory), ("cores", cores)) if v is not None}
    exactly: dict[str, Any] = {"deviceClassName": "gpu.gpupool.io", "allocationMode":
                               "ExactCount", "count": len(devices)}
    if asked:
        exactly["capacity"] = {"requests": asked}
    results = []
    for i, dev in enumerate(devices):
        r: dict[str, Any] = {"driver": dra.DRIVER, "pool": node, "device": dev, "request": "gpu"}
        if asked:
            r["consumedCapacity"] = {"memory": memory or "16Gi", "cores": cores or "100"}
            r["shareID"] = f"share-{name}-{i}"
        results.append(r)
    return {"apiVersion": dra.API_VERSION, "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NAMESPACE, "uid": uid or f"uid-{name}"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
            "status": {"allocation": {"devices": {"results": results}},
                       "reservedFor": [{"resource": "pods", "name": p, "uid": f"uid-{p}"}
                                       for p in pods]}}


def claim_pod(name: str, claim: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod whose one container uses ``claim`` (by its name)."""
    container = {"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]},
                 "env": [{"name": k, "value": v} for k, v in (env or {}).items()]}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "uid": f"uid-{name}"},
            "spec": {"nodeName": NODE, "containers": [container],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]}}


def ref(claim: dict[str, Any]) -> tuple[str, str, str]:
    m = claim["metadata"]
    return m["namespace"], m["name"], m["uid"]
