"""Which containers use a claim, and whether one of them could widen what it gets.

The device-plugin path refuses a GPU container whose own ``env`` sets a variable that
controls its GPUs or limits, or whose ``envFrom`` could (``exposure.env_override``); the
DRA path applies the same rule to every container (init containers included) of the
pods a claim is reserved for that lists the claim in ``resources.claims``. A pod's claim
entry names the claim directly (``resourceClaimName``) or through a template; the
generated claim's name is in the pod's ``status.resourceClaimStatuses``. Until that is
known every container that uses some claim is checked (the stricter reading). A container
served an extended resource through DRA uses the claim named in the pod's
``status.extendedResourceClaimStatus``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpupool.nodeagent.exposure import env_override
from gpupool.nodeagent.pods import GpuContainer


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _entries(pod: Mapping[str, Any], claim: str) -> set[str] | None:
    """The pod's claim entry names that are ``claim`` (None: not known yet)."""
    spec, status = _map(pod.get("spec")), _map(pod.get("status"))
    direct = {str(e.get("name")) for e in map(_map, spec.get("resourceClaims") or [])
              if e.get("resourceClaimName") == claim}
    generated = list(map(_map, status.get("resourceClaimStatuses") or []))
    direct |= {str(s.get("name")) for s in generated if s.get("resourceClaimName") == claim}
    templated = any(e.get("resourceClaimTemplateName")
                    for e in map(_map, spec.get("resourceClaims") or []))
    if not direct and templated and not generated:
        return None
    return direct


def claim_users(pod: Mapping[str, Any], claim: str) -> list[GpuContainer]:
    """The containers of ``pod`` that use the ResourceClaim named ``claim``."""
    entries = _entries(pod, claim)
    spec = _map(pod.get("spec"))
    extended = _map(_map(pod.get("status")).get("extendedResourceClaimStatus"))
    served = {str(_map(m).get("containerName")) for m in extended.get("requestMappings") or []
              } if extended.get("resourceClaimName") == claim else set()
    out = []
    for c in map(_map, [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]):
        uses = {str(_map(r).get("name")) for r in _map(c.get("resources")).get("claims") or []}
        if (uses and (entries is None or uses & entries)) or str(c.get("name")) in served:
            out.append(_container(c))
    return out


def _container(c: Mapping[str, Any]) -> GpuContainer:
    env = tuple(str(_map(e).get("name", "")) for e in c.get("env") or [])
    env_from = tuple(str(_map(e).get("prefix") or "") for e in c.get("envFrom") or [])
    return GpuContainer(str(c.get("name") or "?"), 0, 0, 0, env, env_from)


def env_refusal(pods: Iterable[Mapping[str, Any]], claim: str) -> str | None:
    """Why the claim may not be prepared for these pods (a container could override what
    it gets), or None."""
    for pod in pods:
        meta = _map(pod.get("metadata"))
        for container in claim_users(pod, claim):
            reason = env_override(container)
            if reason:
                return f"pod {meta.get('namespace')}/{meta.get('name')}: {reason}"
    return None


def claim_uses(pod: Mapping[str, Any]) -> dict[str, frozenset[str]]:
    """Container name -> the names of the ResourceClaims it uses (a templated claim only
    once its generated name is in the pod's status; the claim kube-scheduler made for
    extended resources served through DRA from ``status.extendedResourceClaimStatus``)."""
    spec, status = _map(pod.get("spec")), _map(pod.get("status"))
    claim_of = {str(e.get("name")): str(e.get("resourceClaimName"))
                for e in map(_map, spec.get("resourceClaims") or [])
                if e.get("resourceClaimName")}
    claim_of.update({str(s.get("name")): str(s.get("resourceClaimName"))
                     for s in map(_map, status.get("resourceClaimStatuses") or [])
                     if s.get("resourceClaimName")})
    out: dict[str, set[str]] = {}
    for c in map(_map, [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]):
        uses = {claim_of[n] for r in _map(c.get("resources")).get("claims") or []
                if (n := str(_map(r).get("name"))) in claim_of}
        if uses:
            out.setdefault(str(c.get("name") or "?"), set()).update(uses)
    extended = _map(status.get("extendedResourceClaimStatus"))  # extended resources via DRA
    if extended.get("resourceClaimName"):
        for m in map(_map, extended.get("requestMappings") or []):
            out.setdefault(str(m.get("containerName") or "?"), set()).add(
                str(extended["resourceClaimName"]))
    return {c: frozenset(v) for c, v in out.items()}
