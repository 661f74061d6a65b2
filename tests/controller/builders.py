"""Builders of the plain-dict Kubernetes objects the controller reads (as the API serves)."""

from __future__ import annotations

from typing import Any

from gpupool.contract import annotations as records
from gpupool.contract import names
from gpupool.controller.defaults import CONTROLLER, MANAGED_BY
from gpupool.core.allocation import Allocation, Slice
from gpupool.security.signing import SigningKeys, claims_of

KEYS = SigningKeys().added(0.0)
"""The test cluster's decision signing key (what the extender holds)."""
RING = KEYS.public()


def verify(uid: str, namespace: str, name: str, annotations: Any, signature: str | None) -> str:
    """A ``Verify`` with the test cluster's published keys."""
    return RING.verify(claims_of(uid, namespace, name, annotations), signature)


def sign(pod: dict[str, Any], keys: SigningKeys = KEYS) -> dict[str, Any]:
    """``pod`` with its decision signed for it, as the extender signs at bind."""
    meta = pod["metadata"]
    notes = meta["annotations"]
    notes[names.ANNOTATION_SIGNATURE] = keys.active(0.0).sign(
        claims_of(meta["uid"], meta["namespace"], meta["name"], notes))
    return pod

GIB = 1024


def device(node: str, index: int, model: str = "A100-SXM4-80GB", memory_mib: int = 80 * GIB,
           labels: dict[str, str] | None = None) -> dict[str, Any]:
    uuid = f"GPU-{node}-{index}"
    return {"metadata": {"name": uuid.lower(),
                         "labels": {"gpupool.io/node": node, "gpupool.io/model": model}},
            "spec": {"node": node, "uuid": uuid, "index": index, "model": model,
                     "memoryMiB": memory_mib, "architecture": "ampere", "numaNode": 0,
                     "labels": labels or {}},
            "status": {"health": "Healthy"}}


def resource_class(name: str, selector: Any, owned: bool = False,
                   status: dict[str, Any] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "resourceVersion": "7"}
    if owned:
        meta["labels"] = {MANAGED_BY: CONTROLLER}
    obj: dict[str, Any] = {"metadata": meta, "spec": {"selector": selector}}
    if status is not None:
        obj["status"] = status
    return obj


def model_selector(*models: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": "gpupool.io/model", "operator": "In",
                                  "values": list(models)}]}


def group(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": spec}


def slices(node: str, *gpus: tuple[int, int, int]) -> tuple[Slice, ...]:
    """(position, MiB, core %) per GPU of ``node`` (uuids as ``device`` makes them)."""
    return tuple(Slice(f"GPU-{node}-{p}", p, mib, core, "main") for p, mib, core in gpus)


def placed_pod(name: str, ns: str, node: str, gpus: tuple[Slice, ...], exclusive: bool = False,
               group_name: str | None = None, class_name: str | None = None,
               phase: str = "Running") -> dict[str, Any]:
    """A bound pod with a decision recorded the way the extender records it."""
    uid = f"uid-{ns}-{name}"
    notes = records.encode(Allocation(uid, node, 1000, 1024, gpus, exclusive),
                           "2026-01-01T00:00:00Z", names.PHASE_ALLOCATED)
    limits: dict[str, Any] = {names.RESOURCE_GPU: str(len(gpus))}
    if class_name:
        limits = {names.CLASS_RESOURCE_PREFIX + class_name: str(len(gpus))}
    labels = {names.LABEL_GROUP: group_name} if group_name else {}
    if group_name:  # bind records (and signs) the group it charged
        notes[names.ANNOTATION_RESOURCE_GROUP] = group_name
    return sign({"metadata": {"name": name, "namespace": ns, "uid": uid, "annotations": notes,
                              "labels": labels},
                 "spec": {"nodeName": node, "containers": [
                     {"name": "main", "image": "busybox", "resources": {"limits": limits}}]},
                 "status": {"phase": phase}})
