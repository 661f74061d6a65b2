"""The client side of a remote GPU slice, given at admission to a ``remote-required`` pod,
and to a ``remote-allowed`` one where a data-plane provider is configured.

Mutating (``patch``), on a pod annotated ``gpupool.io/placement: remote-required`` that
asks a GPU:

* its GPU count moves from ``gpupool.io/gpu`` (kube-scheduler counts it against the
  node's own GPUs, and kubelet hands it out through the node's device plugin) to
  ``gpupool.io/remote-gpu`` (neither: the pod may run on any node), in limits and
  requests; a container that named no count gets one, as the implied ``gpupool.io/gpu``;
* ``gpupool.io/slice``: a fresh slice name (``contract.slices``), whatever the pod said;
* the native sidecar ``gpupool-slice-client`` (first init container, ``restartPolicy:
  Always``: Kubernetes 1.29 and later) running ``gpupool slice-client`` toward the
  slice's Service, with a startup probe on its ``/ready``, so the pod's containers start
  once the slice is usable; its session credentials are the TLS Secret the controller
  issues (``gpupool-slice-<slice>``), mounted read-only;
* the provider's client settings in the GPU container (``client_env``), and
  ``NVIDIA_VISIBLE_DEVICES=void`` (the node's own GPUs are not the pod's).

A ``remote-allowed`` pod keeps ``gpupool.io/gpu`` (it runs on a node with GPUs and is
served by that node's devices when they have room) and gets the slice name and the sidecar
with two differences: the sidecar is also given its pod's decision (``--decision``, the
``gpupool.io/allocation`` annotation through the downward API: bind writes it in the same
request that binds the pod, so it is there when the sidecar starts) and idles, ready at
once, when the decision is served by the pod's own devices; its credentials volume is
``optional`` (the controller issues the Secret only for a slice served remotely). Its GPU
containers get no variables here: the node agent's Allocate gives them either their
devices or, for a slice served remotely, no device and ``contract.slices.client_env``.

A pod that already carries what the webhook writes (the sidecar's name, its volume, the
provider's variables) is refused (``forged``), and so is one on the host's network
(``host_network``). Validating (``unexpected``): what a
remote pod carries of the injection must be exactly the injection, and nothing of it
may appear on any other pod. Pure: no I/O; the slice name is drawn by the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.contract import names, slices
from gpupool.core.request import PodRequest, Serving
from gpupool.webhook.review import Obj, pointer

NOT_ENABLED = "remote GPU slices are not enabled on this cluster (no data-plane provider)"
LUPINE_ENV = slices.LUPINE_ENV
SIDECAR_KEYS = frozenset({
    "name", "image", "command", "args", "restartPolicy", "env", "volumeMounts",
    "startupProbe", "readinessProbe", "resources", "securityContext",
    # what the API server fills in before validating admission
    "imagePullPolicy", "terminationMessagePath", "terminationMessagePolicy"})


@dataclass(frozen=True, slots=True)
class RemoteSettings:
    """A deployment's data-plane provider and where its slice servers live."""

    provider: str = "none"  # contract.slices.PROVIDERS
    namespace: str = "gpupool-slices"  # the slice servers' and their Services'
    image: str = ""  # the sidecar's image (gpupool's own)
    lupine_preload: str = ""  # LUPINE's client library in the workload's image, if preloaded
    new_slice: Callable[[], str] = lambda: ""  # draws a slice name (the CLI: 16 hex digits)

    @property
    def enabled(self) -> bool:
        return self.provider != "none"


def is_remote(request: PodRequest) -> bool:
    """Whether the pod's slices are always served by a slice server (``remote-required``)."""
    return bool(request.gpus) and request.serving is Serving.REMOTE_REQUIRED


def gets_sidecar(request: PodRequest, settings: RemoteSettings) -> bool:
    """Whether the pod is given the client side of a remote slice: a ``remote-required``
    pod (refused where no provider is configured), a ``remote-allowed`` one where a
    provider is configured."""
    return is_remote(request) or (bool(request.gpus) and settings.enabled
                                  and request.serving is Serving.REMOTE_ALLOWED)


def client_env(settings: RemoteSettings) -> list[Obj]:
    """A ``remote-required`` GPU container's variables: no GPU of its node, the provider's
    client toward the sidecar's data plane on loopback (``contract.slices.client_env``)."""
    return [{"name": name, "value": value}
            for name, value in slices.client_env(settings.provider, settings.lupine_preload)]


def sidecar(settings: RemoteSettings, slice_name: str, allowed: bool = False) -> Obj:
    """The sidecar container of slice ``slice_name`` (``allowed``: of a ``remote-allowed``
    pod, told its pod's decision)."""
    probe = {"httpGet": {"path": "/ready", "port": slices.CLIENT_STATUS_PORT}}
    decision = [f"--decision=$({slices.DECISION_ENV})"] if allowed else []
    told = [{"name": slices.DECISION_ENV, "valueFrom": {"fieldRef": {
        "fieldPath": f"metadata.annotations['{names.ANNOTATION_ALLOCATION}']"}}}] \
        if allowed else []
    return {
        "name": slices.SIDECAR, "image": settings.image, "restartPolicy": "Always",
        "command": ["gpupool", "slice-client"],
        "args": ["--pod-uid=$(GPUPOOL_POD_UID)",
                 f"--slice-server={slices.server_address(slice_name, settings.namespace)}",
                 f"--credentials-dir={slices.CREDENTIALS_DIR}",
                 f"--port={slices.DATA_PORT}", f"--status-port={slices.CLIENT_STATUS_PORT}",
                 *decision],
        "env": [{"name": "GPUPOOL_POD_UID",
                 "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}, *told],
        "volumeMounts": [{"name": slices.CREDENTIALS_VOLUME,
                          "mountPath": slices.CREDENTIALS_DIR, "readOnly": True}],
        # the pod's containers start once the slice is usable (300 s at most, then the
        # sidecar is restarted); readiness follows the server's heartbeats afterwards
        "startupProbe": {**probe, "periodSeconds": 2, "failureThreshold": 150},
        "readinessProbe": {**probe, "periodSeconds": 5},
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                      "limits": {"memory": "128Mi"}},
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532,
                            "allowPrivilegeEscalation": False,
                            "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
    }


def volume(slice_name: str, allowed: bool = False) -> Obj:
    """The sidecar's credentials; ``optional`` for a ``remote-allowed`` pod (its Secret
    exists only once its slice is served remotely: a pod served locally must start)."""
    secret: Obj = {"secretName": slices.client_secret(slice_name)}
    return {"name": slices.CREDENTIALS_VOLUME,
            "secret": {**secret, "optional": True} if allowed else secret}


# -- mutating -------------------------------------------------------------------------------
def patch(spec: Mapping[str, Any], annotations: Mapping[str, Any] | None,
          request: PodRequest, settings: RemoteSettings) -> list[Obj]:
    """The JSON patch that makes ``spec`` a remote-slice pod (after ``forged`` found
    nothing); a ``remote-allowed`` pod keeps its count and gets no variables."""
    name = settings.new_slice()
    allowed = not is_remote(request)
    ops = [] if allowed else count_patch(spec, request)
    if annotations is None:
        ops.append({"op": "add", "path": "/metadata/annotations",
                    "value": {names.ANNOTATION_SLICE: name}})
    else:
        ops.append({"op": "add", "path": pointer("metadata", "annotations",
                                                 names.ANNOTATION_SLICE), "value": name})
    ops.append(_prepend(spec, "initContainers", sidecar(settings, name, allowed)))
    ops += _append(("spec", "volumes"), spec.get("volumes"), [volume(name, allowed)])
    gpu_containers = set() if allowed else {d.container for d in request.gpus}
    for i, c in _containers(spec):
        if str(c.get("name") or "") in gpu_containers:
            ops += _append(("spec", "containers", i, "env"), c.get("env"), client_env(settings))
    return ops


def count_patch(spec: Mapping[str, Any], request: PodRequest) -> list[Obj]:
    """``gpupool.io/gpu`` -> ``gpupool.io/remote-gpu`` in limits and requests (added where
    the container named no count)."""
    counts = {d.container: str(d.count) for d in request.gpus}
    ops: list[Obj] = []
    for i, c in _containers(spec):
        count = counts.get(str(c.get("name") or ""))
        if count is None:
            continue
        res = c.get("resources") if isinstance(c.get("resources"), Mapping) else {}
        base = ("spec", "containers", i, "resources")
        if not res:
            ops.append({"op": "add", "path": pointer(*base), "value": {
                "limits": {names.RESOURCE_REMOTE_GPU: count},
                "requests": {names.RESOURCE_REMOTE_GPU: count}}})
            continue
        for part in ("limits", "requests"):
            amounts = res.get(part)
            if not isinstance(amounts, Mapping):
                ops.append({"op": "add", "path": pointer(*base, part),
                            "value": {names.RESOURCE_REMOTE_GPU: count}})
                continue
            if names.RESOURCE_GPU in amounts:
                ops.append({"op": "remove", "path": pointer(*base, part, names.RESOURCE_GPU)})
            if names.RESOURCE_REMOTE_GPU not in amounts:
                ops.append({"op": "add", "path": pointer(*base, part,
                                                         names.RESOURCE_REMOTE_GPU),
                            "value": count})
    return ops


def host_network(spec: Mapping[str, Any], request: PodRequest) -> str:
    """Why a remote pod's network cannot hold its data plane ("" when it can): on the
    host's network the sidecar's loopback port, which takes no credential, is the node's."""
    if spec.get("hostNetwork") is not True:
        return ""
    return (f"a {request.serving.value} pod may not use the host's network "
            "(spec.hostNetwork): its sidecar serves a remote slice on loopback without "
            "credentials, which would be the node's loopback, open to every host-network "
            "process there")


def forged(spec: Mapping[str, Any], settings: RemoteSettings) -> list[str]:
    """What a remote pod, as written, carries of what only the webhook writes (empty:
    nothing)."""
    out = _named(spec)
    reserved = {e["name"] for e in client_env(settings)} | set(LUPINE_ENV)
    for where, c in _all_containers(spec):
        out += [f"{where} sets {e.get('name')}" for e in _list(c.get("env"))
                if isinstance(e, Mapping) and e.get("name") in reserved]
    return out


def _named(spec: Mapping[str, Any]) -> list[str]:
    """Containers and volumes named as the injection's."""
    out = [f"{where} is named {slices.SIDECAR}" for where, c in _all_containers(spec)
           if c.get("name") == slices.SIDECAR]
    return out + [f"volume {slices.CREDENTIALS_VOLUME}" for v in _list(spec.get("volumes"))
                  if isinstance(v, Mapping) and v.get("name") == slices.CREDENTIALS_VOLUME]


# -- validating -----------------------------------------------------------------------------
def unexpected(spec: Mapping[str, Any], annotations: Mapping[str, Any],
               request: PodRequest | None, settings: RemoteSettings) -> list[str]:
    """What a new pod carries of the injection that the webhook did not write: anything of
    it on a pod that gets none (``gets_sidecar``); on one that does, a sidecar, volume or
    variables that differ from the injection for its slice (a ``remote-allowed`` pod's
    containers carry none of the provider's variables)."""
    notes = annotations or {}
    if request is None or not gets_sidecar(request, settings):  # variables: ``environment``'s
        found = _named(spec)
        if names.ANNOTATION_SLICE in notes:
            found.append(f"annotation {names.ANNOTATION_SLICE}")
        return found
    try:
        name = slices.checked_slice(notes.get(names.ANNOTATION_SLICE), "the pod")
    except ValueError as exc:
        return [str(exc)]
    allowed = not is_remote(request)
    out = _sidecar_problems(spec, sidecar(settings, name, allowed))
    mine = [v for v in _list(spec.get("volumes")) if isinstance(v, Mapping)
            and v.get("name") == slices.CREDENTIALS_VOLUME]
    want = volume(name, allowed)
    if len(mine) != 1 or not _covers(mine[0], want) or set(mine[0]) != {"name", "secret"} \
            or set(_map(mine[0].get("secret"))) - {"defaultMode"} != set(want["secret"]):
        out.append(f"volume {slices.CREDENTIALS_VOLUME} is not the slice's credentials")
    gpu_containers = set() if allowed else {d.container for d in request.gpus}
    wanted = client_env(settings)
    for where, c in _all_containers(spec):
        mine = [e for e in _list(c.get("env")) if isinstance(e, Mapping)
                and e.get("name") in {w["name"] for w in wanted} | set(LUPINE_ENV)]
        expected = wanted if str(c.get("name") or "") in gpu_containers and \
            where.startswith("container ") else []
        if mine != expected:
            out.append(f"{where}: its provider settings are not the ones gpupool writes")
    return out


def without_injection(spec: Mapping[str, Any], settings: RemoteSettings) -> dict[str, Any]:
    """``spec`` without the sidecar and the GPU container's injected variables (what the
    pod's author wrote, for the environment guards)."""
    injected = {e["name"] for e in client_env(settings)}
    out = dict(spec)
    out["initContainers"] = [c for c in _list(spec.get("initContainers"))
                             if not (isinstance(c, Mapping) and c.get("name") == slices.SIDECAR)]
    out["containers"] = [
        {**c, "env": [e for e in _list(c.get("env")) if not (isinstance(e, Mapping) and
                                                             e.get("name") in injected)]}
        if isinstance(c, Mapping) else c for c in _list(spec.get("containers"))]
    return out


def _sidecar_problems(spec: Mapping[str, Any], want: Obj) -> list[str]:
    found = [c for c in _list(spec.get("initContainers"))
             if isinstance(c, Mapping) and c.get("name") == slices.SIDECAR]
    if len(found) != 1:
        return [f"{len(found)} init containers named {slices.SIDECAR} (gpupool writes one)"]
    extra = sorted(set(found[0]) - SIDECAR_KEYS)
    if extra or not _covers(found[0], want):
        return [f"init container {slices.SIDECAR} is not the one gpupool writes"
                + (f" (it sets {', '.join(extra)})" if extra else "")]
    return []


def _covers(have: Any, want: Any) -> bool:
    """``have`` says at least what ``want`` says (the API server adds defaults)."""
    if isinstance(want, Mapping):
        return isinstance(have, Mapping) and all(k in have and _covers(have[k], v)
                                                 for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(have) == len(want) and \
            all(_covers(h, w) for h, w in zip(have, want, strict=True))
    return bool(have == want)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _containers(spec: Mapping[str, Any]) -> Iterator[tuple[int, Mapping[str, Any]]]:
    for i, c in enumerate(_list(spec.get("containers"))):
        if isinstance(c, Mapping):
            yield i, c


def _all_containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for key, noun in (("containers", "container"), ("initContainers", "init container"),
                      ("ephemeralContainers", "ephemeral container")):
        for c in _list(spec.get(key)):
            if isinstance(c, Mapping):
                yield f"{noun} {c.get('name', '?')}", c


def _prepend(spec: Mapping[str, Any], key: str, item: Obj) -> Obj:
    if isinstance(spec.get(key), list):
        return {"op": "add", "path": pointer("spec", key, 0), "value": item}
    return {"op": "add", "path": pointer("spec", key), "value": [item]}


def _append(path: tuple[str | int, ...], current: Any, items: list[Obj]) -> list[Obj]:
    if isinstance(current, list):
        return [{"op": "add", "path": pointer(*path) + "/-", "value": item} for item in items]
    return [{"op": "add", "path": pointer(*path), "value": items}]
