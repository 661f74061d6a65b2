"""A pod's unallocated ResourceClaims as device asks: what each request may take, in order.

``drapods.claims_request`` folds a pod's claims into one core request (its quota and its
score when the claims ask plain GPUs). Claims can say more, and kube-scheduler's
allocator reads all of it; ``claim_asks`` keeps it for ``draselect``:

* a request's CEL ``selectors`` (and its DeviceClass: ``<class>.gpupool.io`` narrows to
  that ResourceClass when the extender knows it);
* ``allocationMode: All``: every matching device of the node, each with the request's
  capacity (none asked: each whole);
* ``firstAvailable``: the sub-requests in order (the allocator takes the first that can
  be satisfied on the node);
* ``constraints`` with ``matchAttribute``: the devices of the named requests (all of the
  claim's when none are named) share one value of that attribute.

Only requests and sub-requests of gpupool's DeviceClasses are kept (other drivers'
devices are not in gpupool's state); a ``firstAvailable`` whose gpupool sub-requests are
not its first ones is read as if the other drivers' could not be had. Unreadable
requests raise ``InvalidInput`` naming the claim and request, as ``claims_request`` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.contract.dra import DRIVER
from gpupool.core.request import GpuDemand, PodRequest
from gpupool.extender.dra.drapods import _list, claim_names, device_demand
from gpupool.extender.state.draclaims import ClaimRecord, DraClaims


@dataclass(frozen=True, slots=True)
class DeviceChoice:
    """One way to satisfy a request: a request's ``exactly`` or one sub-request."""

    name: str  # "request" or "request/sub-request"
    demand: GpuDemand  # per device; count 1 when ``all_devices``
    all_devices: bool
    selectors: tuple[str, ...]  # the CEL expressions, all required
    gpu_class: str | None  # the ResourceClass its DeviceClass names (when known)


@dataclass(frozen=True, slots=True)
class RequestAsk:
    claim: str  # namespace/name
    name: str
    choices: tuple[DeviceChoice, ...]  # in the order the allocator tries them


@dataclass(frozen=True, slots=True)
class SameAttribute:
    """``matchAttribute``: the named requests' devices share the attribute's value."""

    claim: str
    domain: str
    name: str
    requests: tuple[str, ...]  # request names of the claim ("" entries never)


@dataclass(frozen=True, slots=True)
class ClaimAsks:
    requests: tuple[RequestAsk, ...] = ()
    constraints: tuple[SameAttribute, ...] = ()

    @property
    def plain(self) -> bool:
        """Nothing ``claims_request`` cannot say: no selector, All, alternative,
        constraint, or several ResourceClasses."""
        classes = {c.gpu_class for r in self.requests for c in r.choices}
        return not self.constraints and len(classes) <= 1 and all(
            len(r.choices) == 1 and not r.choices[0].selectors and not r.choices[0].all_devices
            for r in self.requests)

    @property
    def expressions(self) -> frozenset[str]:
        return frozenset(e for r in self.requests for c in r.choices for e in c.selectors)


def claim_asks(pod: Mapping[str, Any], base: PodRequest, claims: DraClaims,
               classes: frozenset[str]) -> ClaimAsks:
    """The device asks of the pod's unallocated claims (``classes``: the ResourceClasses
    the extender knows)."""
    namespace = base.tenant or "default"
    requests: list[RequestAsk] = []
    constraints: list[SameAttribute] = []
    for name in claim_names(pod):
        record = claims.record(namespace, name)
        if record is None or record.allocated:
            continue
        asks = [a for a in (_request(record, raw, classes) for raw in record.requests) if a]
        requests += asks
        if asks:
            constraints += _constraints(record, {a.name for a in asks})
    return ClaimAsks(tuple(requests), tuple(constraints))


def _request(record: ClaimRecord, raw: Mapping[str, Any], classes: frozenset[str]
             ) -> RequestAsk | None:
    name = str(raw.get("name") or "?")
    ref = f"{record.namespace}/{record.name}"
    exactly = raw.get("exactly")
    if isinstance(exactly, Mapping):
        alternatives = [(name, exactly)]
    else:
        alternatives = [(f"{name}/{s.get('name') or '?'}", s)
                        for s in _list(raw.get("firstAvailable")) if isinstance(s, Mapping)]
    choices = []
    for label, ask in alternatives:
        choice = _choice(ref, label, ask, classes)
        if choice is not None:
            choices.append(choice)
    return RequestAsk(ref, name, tuple(choices)) if choices else None


def _choice(ref: str, label: str, ask: Mapping[str, Any], classes: frozenset[str]
            ) -> DeviceChoice | None:
    where = f"ResourceClaim {ref} request {label}"
    every = ask.get("allocationMode") == "All"
    if every:
        ask = {**ask, "count": 1}
    found = device_demand(ask, where, f"{ref.split('/', 1)[1]}/{label}")
    if found is None:
        return None
    demand, cls = found
    return DeviceChoice(label, demand, every, selectors_of(ask),
                        cls if cls in classes else None)


def selectors_of(ask: Mapping[str, Any]) -> tuple[str, ...]:
    """The CEL expressions of a request's ``selectors`` (in order)."""
    out = []
    for sel in _list(ask.get("selectors")):
        cel = sel.get("cel") if isinstance(sel, Mapping) else None
        expression = cel.get("expression") if isinstance(cel, Mapping) else None
        if isinstance(expression, str):
            out.append(expression)
    return tuple(out)


def _constraints(record: ClaimRecord, ours: set[str]) -> list[SameAttribute]:
    out = []
    ref = f"{record.namespace}/{record.name}"
    for raw in record.constraints:
        attribute = raw.get("matchAttribute") if isinstance(raw, Mapping) else None
        if not isinstance(attribute, str) or not attribute:
            continue
        domain, sep, ident = attribute.partition("/")
        if not sep:
            domain, ident = DRIVER, attribute
        named = [str(r).split("/", 1)[0] for r in _list(raw.get("requests"))]
        requests = tuple(r for r in (named or sorted(ours)) if r in ours)
        if requests:
            out.append(SameAttribute(ref, domain, ident, requests))
    return out

