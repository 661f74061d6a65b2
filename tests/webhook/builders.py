"""Builders of the objects and AdmissionReview v1 bodies the webhook tests send."""

from __future__ import annotations

import json
from typing import Any

from gpupool.webhook.decisions import service_account

NODE_AGENT = service_account("gpupool-system", "gpupool-node-agent")
EXTENDER = service_account("gpupool-system", "gpupool-extender")
TENANT = "alice"
Obj = dict[str, Any]


def container(name: str = "main", limits: dict[str, str] | None = None,
              env: dict[str, str] | None = None, env_from: list[Obj] | None = None,
              requests: dict[str, str] | None = None) -> Obj:
    c: Obj = {"name": name, "image": "cuda:12"}
    if limits is not None or requests is not None:
        c["resources"] = {}
        if limits is not None:
            c["resources"]["limits"] = dict(limits)
        if requests is not None:
            c["resources"]["requests"] = dict(requests)
    if env is not None:
        c["env"] = [{"name": k, "value": v} for k, v in env.items()]
    if env_from is not None:
        c["envFrom"] = env_from
    return c


def pod(name: str = "p", ns: str = "team-a", *containers: Obj,
        annotations: dict[str, str] | None = None, scheduler: str | None = None,
        init: list[Obj] | None = None, node: str | None = None, ephemeral: list[Obj] | None = None
        ) -> Obj:
    meta: Obj = {"name": name, "namespace": ns}
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    spec: Obj = {"containers": list(containers) or [container()]}
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if init is not None:
        spec["initContainers"] = init
    if node is not None:
        spec["nodeName"] = node
    if ephemeral is not None:
        spec["ephemeralContainers"] = ephemeral
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def gpu_pod(name: str = "p", ns: str = "team-a", **kw: Any) -> Obj:
    return pod(name, ns, container(limits={"gpupool.io/gpu-memory": "1024",
                                           "gpupool.io/gpu-core": "10"}), **kw)


def review(obj: Obj | None, *, operation: str = "CREATE", resource: str = "pods",
           sub: str = "", old: Obj | None = None, user: str = TENANT,
           extra: dict[str, list[str]] | None = None, uid: str = "uid-1",
           namespace: str | None = None, group: str = "", kind: str = "Pod") -> Obj:
    meta = (obj or old or {}).get("metadata") or {}
    request: Obj = {
        "uid": uid, "kind": {"group": group, "version": "v1", "kind": kind},
        "resource": {"group": group, "version": "v1", "resource": resource},
        "operation": operation,
        "namespace": meta.get("namespace", "") if namespace is None else namespace,
        "name": meta.get("name", ""),
        "userInfo": {"username": user, "groups": ["system:authenticated"],
                     "extra": extra or {}},
        "object": obj, "oldObject": old, "dryRun": False,
    }
    if sub:
        request["subResource"] = sub
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def body(review_obj: Obj) -> bytes:
    return json.dumps(review_obj).encode()
