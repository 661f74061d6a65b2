"""Which rule judges which request: ``mutate`` and ``validate`` turn a ``Request`` into a
``Verdict``. Pure: no I/O; every rule is in its own module.

Mutating (``/mutate``), pods CREATE: a GPU pod that writes no ``gpupool.io/placement`` is
given its namespace's default or minimum first, and is from then on a pod that wrote it
(``placement``; below the minimum: refused); gpupool's scheduler and the implied
``gpupool.io/gpu`` (``scheduling``); for a ``remote-required`` pod the client side of its
remote slice instead (``remote``: its count as ``gpupool.io/remote-gpu``, the sidecar, the
provider's settings), refused when no provider is configured or the pod already carries
what the webhook writes; for a ``remote-allowed`` pod, where a provider is configured, the
implied count and the sidecar that serves a slice only if it is placed elsewhere.
Validating (``/validate``):

* pods CREATE: no decision annotations (``decisions``), no guarded environment
  (``environment``), and a GPU ask the scheduler can read (``contract.podspec_request``;
  burst limits, ``contract.burst``, only on a pod that asks a shared slice); what a pod
  carries of a remote slice's client side is exactly what the webhook wrote
  (``remote.unexpected``); its placement is not below its namespace's minimum
  (``placement``);
* pods and pods/status UPDATE: decision annotations change only by their writers; a
  changed ``gpupool.io/placement`` is not below the namespace's minimum;
* pods/ephemeralcontainers UPDATE: the new ephemeral containers' environment;
* pods/binding CREATE: a Binding carries a decision only from gpupool's extender;
* pods/eviction CREATE by a node agent: only of a pod on its own node (``evictions``);
* resourceclasses / resourcegroups CREATE and UPDATE: they parse (``contract.tenancy``;
  an automatic group's planning spec too); tenantquotas / gpupermissions: they parse
  (``contract.quotas``).

Anything else is allowed: the webhook configurations send only what is listed here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpupool.contract import burst, names, nslabels, quotas, tenancy
from gpupool.contract.podspec_request import pod_request
from gpupool.core.errors import InvalidInput
from gpupool.core.request import PodRequest, Serving
from gpupool.webhook import decisions, environment, evictions, placement, remote, scheduling
from gpupool.webhook.remote import RemoteSettings
from gpupool.webhook.review import Obj, Request, Verdict


@dataclass(frozen=True, slots=True)
class Settings:
    """What a deployment decides: the scheduler's name, who writes what, how wide a guard."""

    scheduler: str = "gpupool-scheduler"
    writers: decisions.Writers = field(default_factory=decisions.Writers)
    guard_all_pods: bool = True  # NVIDIA_VISIBLE_DEVICES naming GPUs refused on every pod
    node_scoped: frozenset[str] = frozenset()  # accounts that may evict on their node only
    pod_node: evictions.PodNode | None = None  # how to look a pod's node up
    remote: RemoteSettings = field(default_factory=RemoteSettings)  # remote GPU slices
    namespaces: placement.NamespaceLookup | None = None  # None: no namespace says anything


def pod_ref(request: Request) -> str:
    """``pod <namespace>/<name>`` (a generated name shows its prefix and ``*``)."""
    meta = _map(_map(request.obj).get("metadata"))
    name = request.name or str(meta.get("name") or "")
    if not name:
        name = f"{meta.get('generateName') or ''}*"
    return f"pod {request.namespace or meta.get('namespace') or 'default'}/{name}"


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _readable_pod(request: Request) -> dict[str, Any]:
    """The pod as ``pod_request`` reads it: namespace from the request, a name even when
    the API server has not generated it yet."""
    pod = dict(_map(request.obj))
    meta = dict(_map(pod.get("metadata")))
    meta["name"] = pod_ref(request).split("/", 1)[1]
    meta["namespace"] = request.namespace or meta.get("namespace") or "default"
    pod["metadata"] = meta
    return pod


def gpu_request(request: Request, as_written: bool = False) -> PodRequest | Verdict | None:
    """The pod's GPU ask (None: it asks no gpupool resource), or a denial saying why the
    scheduler could not read it (``as_written``: before the mutation, ``remote``)."""
    spec = _map(_map(request.obj).get("spec"))
    if not scheduling.asks_gpupool(spec):
        notes = _map(_map(_map(request.obj).get("metadata")).get("annotations"))
        if burst.asks_burst(notes):
            return Verdict.deny(f"{pod_ref(request)} sets a GPU burst limit "
                                f"({', '.join(burst.KEYS)}) but asks no gpupool GPU", 422,
                                "Invalid")
        return None
    try:
        return pod_request(_readable_pod(request), as_written=as_written)
    except InvalidInput as exc:
        return Verdict.deny(f"{exc} (gpupool's scheduler would refuse this pod)", 422,
                            "Invalid")


# -- mutating -----------------------------------------------------------------------------------
def mutate(request: Request, settings: Settings) -> Verdict:
    if request.resource != "pods" or request.sub_resource or request.operation != "CREATE":
        return Verdict.allow()
    asked = gpu_request(request, as_written=True)
    if asked is None or isinstance(asked, Verdict):
        return asked or Verdict.allow()
    settled = _namespace_part(request, settings, defaulting=True)
    if settled.refusal:
        return Verdict.deny(settled.refusal, settled.code, settled.reason)
    if settled.write is None:
        return _mutate_gpu_pod(request, settings, asked, [])
    obj, op = placement.with_placement(_map(request.obj), settled.write)
    request = replace(request, obj=obj)  # from here on, a pod that wrote the namespace's value
    asked = gpu_request(request, as_written=True)
    if asked is None or isinstance(asked, Verdict):
        return asked or Verdict.allow()
    return _mutate_gpu_pod(request, settings, asked, [op])


def _namespace_part(request: Request, settings: Settings, defaulting: bool
                    ) -> placement.Settled:
    """What the pod's namespace writes on it or why it refuses it (``placement``)."""
    meta = _map(_map(request.obj).get("metadata"))
    notes = _map(meta.get("annotations"))
    if settings.namespaces is None or not placement.depends(notes):
        return placement.Settled()
    namespace = request.namespace or str(meta.get("namespace") or "") or "default"
    return placement.settle(pod_ref(request), notes, settings.namespaces(namespace),
                            defaulting)


def _mutate_gpu_pod(request: Request, settings: Settings, asked: PodRequest, first: list[Obj]
                    ) -> Verdict:
    spec = _map(_map(request.obj).get("spec"))
    patch = first + scheduling.scheduler_patch(spec, settings.scheduler)
    warnings = scheduling.other_scheduler_warning(spec, settings.scheduler)
    if not remote.is_remote(asked):
        patch += scheduling.implied_gpu_patch(spec, asked)
    if not remote.gets_sidecar(asked, settings.remote):
        return Verdict.allow(patch, warnings + _remote_allowed_warning(asked))
    refused = _remote_refusal(request, spec, asked, settings.remote)
    if refused is not None:
        return refused
    notes = _map(request.obj).get("metadata")
    annotations = _map(notes).get("annotations") if isinstance(notes, Mapping) else None
    patch += remote.patch(spec, annotations if isinstance(annotations, Mapping) else None,
                          asked, settings.remote)
    return Verdict.allow(patch, warnings)


def _remote_unusable(who: str, spec: Mapping[str, Any], asked: PodRequest,
                     settings: RemoteSettings) -> Verdict | None:
    """Why a pod given a sidecar cannot have a remote slice here (mutating and validating)."""
    if not settings.enabled:
        return Verdict.deny(f"{who}: gpupool.io/placement=remote-required: "
                            f"{remote.NOT_ENABLED}", 422, "Invalid")
    shared = remote.host_network(spec, asked)
    return Verdict.deny(f"{who}: {shared}", 422, "Invalid") if shared else None


def _remote_refusal(request: Request, spec: Mapping[str, Any], asked: PodRequest,
                    settings: RemoteSettings) -> Verdict | None:
    who = pod_ref(request)
    unusable = _remote_unusable(who, spec, asked, settings)
    if unusable is not None:
        return unusable
    found = remote.forged(spec, settings)
    if found:
        return Verdict.deny(f"{who}: {'; '.join(found[:3])}: only gpupool's admission webhook "
                            "writes these (the client side of a remote GPU slice)")
    return None


def _remote_allowed_warning(asked: PodRequest) -> list[str]:
    """A ``remote-allowed`` pod given no sidecar: no provider is configured."""
    if asked.serving is not Serving.REMOTE_ALLOWED:
        return []
    return [f"gpupool.io/placement=remote-allowed: {remote.NOT_ENABLED}, so the pod's GPUs "
            "are served by its own node's devices (docs/remote.md)"]


# -- validating ---------------------------------------------------------------------------------
def validate(request: Request, settings: Settings) -> Verdict:
    if request.operation not in ("CREATE", "UPDATE"):
        return Verdict.allow()
    if request.resource == "pods":
        return _validate_pod(request, settings)
    if request.resource in TENANCY and not request.sub_resource:
        return _validate_tenancy(request)
    return Verdict.allow()


def _validate_pod(request: Request, settings: Settings) -> Verdict:
    who = pod_ref(request)
    sub = request.sub_resource
    if sub == "binding":
        why = decisions.check_binding(who, request.username, request.obj, settings.writers)
        return Verdict.deny(why) if why else Verdict.allow()
    if sub == "ephemeralcontainers":
        return _validate_ephemeral(request, settings)
    if sub == "eviction":
        why = evictions.check_eviction(request, settings.node_scoped, settings.pod_node)
        return Verdict.deny(why) if why else Verdict.allow()
    if sub not in ("", "status"):
        return Verdict.allow()
    why = decisions.check_pod_write(who, request.username, request.operation, request.old,
                                    request.obj, settings.writers)
    if why:
        return Verdict.deny(why)
    if request.operation == "CREATE" and not sub:
        return _validate_new_pod(request, settings, who)
    if request.operation == "UPDATE" and _placement_changed(request):
        return _floor_verdict(request, settings)
    return Verdict.allow()


def _placement_changed(request: Request) -> bool:
    key = names.ANNOTATION_PLACEMENT
    return bool(decisions.annotations_of(request.old).get(key) !=
                decisions.annotations_of(request.obj).get(key))


def _floor_verdict(request: Request, settings: Settings) -> Verdict:
    """A GPU pod's placement, as it now stands, against its namespace's floor."""
    if not scheduling.asks_gpupool(_map(_map(request.obj).get("spec"))):
        return Verdict.allow()
    settled = _namespace_part(request, settings, defaulting=False)
    if settled.refusal:
        return Verdict.deny(settled.refusal, settled.code, settled.reason)
    return Verdict.allow()


def _validate_new_pod(request: Request, settings: Settings, who: str) -> Verdict:
    asked = gpu_request(request)
    if isinstance(asked, Verdict):
        return asked
    if asked is not None:
        floor = _floor_verdict(request, settings)
        if not floor.allowed:
            return floor
    spec = _map(_map(request.obj).get("spec"))
    notes = _map(_map(_map(request.obj).get("metadata")).get("annotations"))
    odd = remote.unexpected(spec, notes, asked, settings.remote)
    if odd:
        return Verdict.deny(f"{who}: {'; '.join(odd[:3])}: only gpupool's admission webhook "
                            "writes the client side of a remote GPU slice")
    if asked is not None and remote.gets_sidecar(asked, settings.remote):
        unusable = _remote_unusable(who, spec, asked, settings.remote)
        if unusable is not None:
            return unusable
        spec = remote.without_injection(spec, settings.remote)
    gpu_pod = asked is not None
    if not gpu_pod and not settings.guard_all_pods:
        return Verdict.allow()
    found = environment.problems(spec, gpu_pod)
    return _env_verdict(who, found, gpu_pod)


def _env_verdict(who: str, found: list[str], gpu_pod: bool) -> Verdict:
    if not found:
        return Verdict.allow()
    what = "a GPU pod may not set what decides its GPUs and limits" if gpu_pod else \
        "a pod that asks no GPU may not expose GPUs"
    more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
    return Verdict.deny(f"{who}: {what}: {'; '.join(found[:3])}{more}")


def _validate_ephemeral(request: Request, settings: Settings) -> Verdict:
    if request.operation != "UPDATE":
        return Verdict.allow()
    spec = _map(_map(request.obj).get("spec"))
    gpu_pod = scheduling.asks_gpupool(spec)
    if not gpu_pod and not settings.guard_all_pods:
        return Verdict.allow()
    before = {str(c.get("name")) for c in _map(_map(request.old).get("spec")).get(
        "ephemeralContainers") or [] if isinstance(c, Mapping)}
    fresh = [c for c in spec.get("ephemeralContainers") or []
             if isinstance(c, Mapping) and str(c.get("name")) not in before]
    found = environment.problems({"ephemeralContainers": fresh}, gpu_pod)
    return _env_verdict(pod_ref(request), found, gpu_pod)


def _validate_tenancy(request: Request) -> Verdict:
    obj = _map(request.obj)
    meta = _map(obj.get("metadata"))
    name = request.name or str(meta.get("name") or "") or f"{meta.get('generateName') or ''}x"
    if request.resource in ("tenantquotas", "gpupermissions"):
        return _validate_quota_or_permission(request.resource, {**obj, "metadata": {
            **meta, "name": name}})
    if request.resource == "resourceclasses":
        kind, parsed = "ResourceClass", tenancy.class_of(obj, name)
    else:
        kind, parsed = "ResourceGroup", tenancy.group_of(obj, name)  # type: ignore[assignment]
        if not isinstance(parsed, tenancy.Broken) and tenancy.is_automatic(obj):
            parsed = tenancy.automatic_of(obj, name)  # type: ignore[assignment]
    if isinstance(parsed, tenancy.Broken):
        return Verdict.deny(f"{kind} {name}: {parsed.message}", 422, "Invalid")
    return Verdict.allow()


TENANCY = ("resourceclasses", "resourcegroups", "tenantquotas", "gpupermissions")


def _validate_quota_or_permission(resource: str, obj: Mapping[str, object]) -> Verdict:
    """TenantQuota and GPUPermission: they parse (``contract.quotas``; its messages name
    the kind and the object)."""
    parsed = quotas.quota_of(obj) if resource == "tenantquotas" else quotas.permission_of(obj)
    if isinstance(parsed, quotas.Broken):
        return Verdict.deny(parsed.message, 422, "Invalid")
    selector = getattr(parsed, "namespace_selector", None)
    keys = nslabels.untrusted_keys(selector) if selector is not None else []
    if keys:
        name = str(_map(obj.get("metadata")).get("name") or "")
        return Verdict.deny(f"TenantQuota {name}: {nslabels.why_untrusted(keys)}", 422,
                            "Invalid")
    return Verdict.allow()
