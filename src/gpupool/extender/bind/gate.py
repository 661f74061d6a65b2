"""What bind may act on: the pod as the API server has it, never a request body.

kube-scheduler's bind call names a pod (``PodName``, ``PodNamespace``, ``PodUID``) and a
node; anyone who could call the extender could name any pod. So bind acts only on a pod
that

* exists (the informer's copy, else a fresh read from the API server),
* has the UID the call names (a pod deleted and created again under the same name is
  another pod),
* is pending and unbound, and is not being deleted,
* names gpupool's scheduler (``spec.schedulerName``): pods of other schedulers are never
  bound by gpupool,

and its decision is made from that pod's own spec, labels and annotations. Each refusal
is an ``InvalidInput`` whose message says which rule the pod broke.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from gpupool.core.errors import InvalidInput
from gpupool.core.request import PodRequest
from gpupool.extender.wire.podspec import pod_request
from gpupool.extender.wire.protocol import BindingArgs
from gpupool.kube.api import KubeApi
from gpupool.kube.errors import KubeError, NotFound

DEFAULT_SCHEDULER = "gpupool-scheduler"
PENDING = (None, "", "Pending")


def bindable_request(args: BindingArgs, known: Any, kube: KubeApi | None,
                     scheduler: str = DEFAULT_SCHEDULER) -> PodRequest:
    """The request of the pod ``args`` names, once it passed every rule above. ``known``
    is the informer's copy of a pending pod with that UID (None: read it from ``kube``)."""
    pod = _builtins(known) if known is not None else None
    if pod is None or not _same_name(pod, args):
        pod = _read(args, kube)
    check(pod, args, scheduler)
    return pod_request(pod)


def check(pod: Mapping[str, Any], args: BindingArgs, scheduler: str) -> None:
    """Raise ``InvalidInput`` unless ``pod`` may be bound as ``args`` asks."""
    who = f"pod {args.namespace}/{args.name}"
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    status = pod.get("status") or {}
    if meta.get("uid") != args.uid:
        raise InvalidInput(f"{who} has uid {meta.get('uid')}, the scheduler asked to bind "
                           f"{args.uid} (deleted and created again?)")
    if spec.get("nodeName"):
        raise InvalidInput(f"{who} is already bound to node {spec['nodeName']}")
    if meta.get("deletionTimestamp"):
        raise InvalidInput(f"{who} is being deleted")
    if status.get("phase") not in PENDING:
        raise InvalidInput(f"{who} is {status.get('phase')}, not Pending")
    named = spec.get("schedulerName") or "default-scheduler"
    if named != scheduler:
        raise InvalidInput(f"{who} names the scheduler {named}, not {scheduler}: gpupool "
                           "binds only the pods of its own scheduler")


def assumable(known: Any, uid: str, scheduler: str = DEFAULT_SCHEDULER) -> bool:
    """Whether ``known``, the informer's copy of the pod with ``uid``, is one bind could act
    on (every rule above): only such a pod's placement is assumed taken until its bind
    (``state.assumptions``), so no request body can hold room for a pod that is not there."""
    pod = _builtins(known) if known is not None else None
    if pod is None:
        return False
    meta = pod.get("metadata") or {}
    try:
        check(pod, BindingArgs(str(meta.get("name")), str(meta.get("namespace") or "default"),
                               uid, ""), scheduler)
    except InvalidInput:
        return False
    return True


def _same_name(pod: Mapping[str, Any], args: BindingArgs) -> bool:
    meta = pod.get("metadata") or {}
    return bool(meta.get("name") == args.name and
                (meta.get("namespace") or "default") == args.namespace)


def _read(args: BindingArgs, kube: KubeApi | None) -> Mapping[str, Any]:
    if kube is None:
        raise InvalidInput(f"pod {args.namespace}/{args.name} is not known to this extender "
                           "and there is no API server to read it from")
    try:
        return kube.get_pod_json(args.namespace, args.name)
    except NotFound:
        raise InvalidInput(f"pod {args.namespace}/{args.name} does not exist") from None
    except KubeError as exc:
        raise InvalidInput(f"reading pod {args.namespace}/{args.name}: {exc}") from None


def as_json(pod: Any) -> Mapping[str, Any]:
    """The informer's copy of a pod (a summary or a full model) as plain JSON values."""
    return _builtins(pod) or {}


def _builtins(pod: Any) -> Mapping[str, Any] | None:
    """A pod summary (or full pod model) as plain JSON values."""
    if isinstance(pod, Mapping):
        return pod
    value = msgspec.to_builtins(pod)
    return value if isinstance(value, Mapping) else None
