"""Filter for pods whose GPUs come from ResourceClaims: the tenant's quota and permissions.

kube-scheduler's DRA plugin finds the nodes where a pod's claims can be allocated and
allocates them; it knows nothing of gpupool's tenants. The ``filter-claims`` verb, called
through the scheduler entry without ``managedResources`` (so for every pod of the
profile), applies to a pod's unallocated claims of gpupool's driver (``drapods``) the
same tenancy checks filter applies to device-plugin pods — the core's
``constraints_for``, one implementation:

* TenantQuota and ResourceClass quota: per sent node, the most the claims could take
  there (``draquota``: ``allocationMode: All`` as every device it selects on the node,
  ``firstAvailable`` as its largest alternative that could be allocated there, each
  request charged to its own class) is checked with the core's quota books; a node where
  it would take the tenant (the pod's namespace) past a limit is refused with the quota's
  reason, the very sentence a device-plugin pod of that namespace gets;
* GPUPermission: a node with fewer permitted GPUs than the claims ask is refused, naming
  the permission (a tenant permitted no GPU at all is refused on every node); and, since
  the allocator may take any device a request selects, so is a node where any request
  (any ``firstAvailable`` alternative) selects a GPU outside the permission (fail closed:
  the reason names the claim and says to select only permitted GPUs).

Only tenancy refuses here. A GPUPermission counts only the permitted GPUs the claims' CEL
selectors select (any of a ``firstAvailable``'s alternatives): the allocator picks among
the selected devices only. Whether the claims fit a node (its free memory and compute,
the selectors themselves, ``firstAvailable`` alternatives) stays the DRA plugin's
judgement; nodes without gpupool GPUs (and names the extender has no inventory of) are
passed for it to judge. ResourceGroups do not apply to claims (docs/dra.md).

Every other pod — no claims, only claims of other drivers, claims all allocated
already, or gpupool's extended resources (the main entry filters those) — gets every
sent node back unchanged, without taking the cache lock.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from dataclasses import replace

import msgspec
import numpy as np

from gpupool.core.eligibility import Catalogue, constraints_for
from gpupool.core.fit import Constraints, demand_of
from gpupool.core.groups import GroupCatalog
from gpupool.core.quota import QuotaBook
from gpupool.core.reasons import Check
from gpupool.core.request import GpuDemand, Mode, PodRequest
from gpupool.core.state import BoolArray, ClusterState, IntArray
from gpupool.core.tenants import TenantBook
from gpupool.extender.dra.draasks import ClaimAsks, claim_asks
from gpupool.extender.dra.drapods import claims_request, has_claims
from gpupool.extender.dra.draquota import node_charges, quota_refusal
from gpupool.extender.dra.drascores import device_masks
from gpupool.extender.dra.host import Host
from gpupool.extender.wire import protocol
from gpupool.extender.wire.nodenames import Matched
from gpupool.extender.wire.refusals import PREFIX, Refusals, member, members_json

log = logging.getLogger(__name__)
VERB = "filter-claims"
NO_GROUPS = GroupCatalog()  # claims belong to no ResourceGroup
NO_QUOTAS, NO_TENANTS = QuotaBook(), TenantBook()  # quota is checked per node (draquota)
# Reason tables of claims requests, apart from filter's: a device-plugin request of the
# same shape explains DRA nodes otherwise (they are out of its reach).
_REFUSALS: weakref.WeakKeyDictionary[Host, dict[frozenset[str], Refusals]] = \
    weakref.WeakKeyDictionary()
REFUSAL_TABLES = 16  # reason tables kept per extender (one per set of selectors in use)


def claims_filter_json(ext: Host, body: bytes) -> bytes:
    """``ExtenderFilterResult`` JSON for the ``filter-claims`` verb (``InvalidInput`` for
    a body or claim that cannot be read: the app answers it as the filter's ``Error``)."""
    args = protocol.read_args(body, VERB)
    if not has_claims(args.pod):
        return pass_all(args)
    base = ext._request(args.pod, args.pod_json)
    if base.gpus:  # gpupool's extended resources: the main entry's filter decides
        return pass_all(args)
    cache = ext.cache
    with cache.lock:
        cache.flush()
        classes = frozenset(cache.catalogue.classes.names())
        request = claims_request(args.pod, base, cache.dra, classes)
        asks = claim_asks(args.pod, base, cache.dra, classes)
        if not request.gpus and not asks.requests:
            return pass_all(args)
        if len({c.gpu_class for r in asks.requests for c in r.choices}) > 1:
            request = replace(request, gpu_class=None)  # each is charged to its own class
        if not request.gpus:  # only All requests: at least one device, permissions apply
            request = replace(request, gpus=(GpuDemand(1, mode=Mode.EXCLUSIVE),))
        answer = _tenancy(ext, args, request, asks)
    ext.metrics.decisions.labels("filter", "claims").inc()
    return answer


def pass_all(args: protocol.ExtenderArgs) -> bytes:
    """Every sent node passes."""
    return protocol.filter_answer(args, args.names_json, None)


def claim_constraints(state: ClusterState, request: PodRequest, catalogue: Catalogue
                      ) -> Constraints:
    """The core's constraints of a claims request: class and GPU permissions; no groups,
    and no quota (what claims take depends on the node: ``quota_rows``)."""
    return constraints_for(state, request, replace(catalogue, groups=NO_GROUPS,
                                                   quotas=NO_QUOTAS, tenants=NO_TENANTS))


def permitted_nodes(state: ClusterState, request: PodRequest, c: Constraints) -> BoolArray:
    """[node] -> has as many GPUs the constraints allow as the claims ask (all True when
    the GPUs are not narrowed)."""
    demand = demand_of(request)
    if c.gpu_mask is None or demand is None:
        return np.ones(len(state.nodes), np.bool_)
    allowed: BoolArray = (state.present & c.gpu_mask).sum(axis=1) >= demand.count
    return allowed


def selected_permitted(ext: Host, c: Constraints, asks: ClaimAsks) -> Constraints:
    """``c`` with the permitted GPUs narrowed to those the claims' selectors select (with
    several alternatives, any of them): kube-scheduler picks among the selected devices,
    so a node whose permitted GPUs are not among them would give the pod a GPU its tenant
    may not use."""
    if c.gpu_mask is None or c.permission is None or not asks.expressions:
        return c
    state, cache = ext.cache.state, ext.cache
    masks = device_masks(cache.dra)
    dra_rows = cache.modes.dra_mask(state)
    masks.refresh(state, cache.dra, dra_rows)
    selected = np.zeros(state.present.shape, np.bool_)
    for ask in asks.requests:
        for choice in ask.choices:
            selected |= masks.mask(state, cache.dra, dra_rows, choice.selectors, ask.claim) \
                if choice.selectors else state.present
    return replace(c, gpu_mask=c.gpu_mask & selected,
                   permission=f"{c.permission} among the devices the claim's selectors select")


def _tenancy(ext: Host, args: protocol.ExtenderArgs, request: PodRequest,
             asks: ClaimAsks) -> bytes:
    cache = ext.cache
    state = cache.state
    table = ext._table(state)
    sent = table.match(args.names_json) if args.names is None else table.match_names(args.names)
    c = claim_constraints(state, request, cache.catalogue)
    if c.blocked is not None:
        log.info("filter-claims: pod %s refused: %s", request.key, c.blocked.message)
        every = _names(state, sent, np.arange(len(sent.rows)))
        return _refuse_all(args, every, PREFIX + c.blocked.message, c.blocked.permanent)
    rows = sent.rows
    over, quota_failed, quota_never = quota_rows(ext, request, asks, sent)
    ok = np.ones(len(rows), np.bool_)  # names without inventory: the DRA plugin judges
    known = rows >= 0
    has_gpus = state.present[rows[known]].any(axis=1)
    selected = selected_permitted(ext, c, asks)
    ok[known] = ~has_gpus | permitted_nodes(state, request, selected)[rows[known]]
    wide = outside_permission(ext, request, c, asks, sent)
    wide[(wide >= 0) & (over | ~ok)] = -1  # those nodes are refused for another reason
    for k in np.flatnonzero(wide >= 0).tolist():
        why = wider_than_permission(asks.requests[int(wide[k])].claim, c.permission or "")
        quota_never.append(member(_names(state, sent, np.array([k]))[0], why))
    over |= wide >= 0
    c = selected
    if ok.all() and not over.any():
        return pass_all(args)
    passing = np.flatnonzero(ok & ~over)
    kept = msgspec.json.encode(_names(state, sent, passing)) if args.cache_capable else b""
    if ok.all():
        return protocol.filter_answer(args, kept, passing, members_json(quota_failed),
                                      members_json(quota_never))
    tables = _REFUSALS.setdefault(ext, {})
    refusals = tables.get(asks.expressions)  # the sentences differ with the selectors
    if refusals is None:
        if len(tables) >= REFUSAL_TABLES:
            tables.clear()
        refusals = tables[asks.expressions] = Refusals(ext.metrics)
    failed, unresolvable = refusals.of(state, request, c, cache.catalogue_version,
                                       sent.names, rows, ok | over)
    return protocol.filter_answer(args, kept, passing, _joined(failed, quota_failed),
                                  _joined(unresolvable, quota_never))


def quota_rows(ext: Host, request: PodRequest, asks: ClaimAsks, sent: Matched
               ) -> tuple[BoolArray, list[bytes], list[bytes]]:
    """([sent] refused for quota, their FailedNodes members, their unresolvable ones):
    each node's worst-case charge (``draquota``) checked with the core's quota books,
    once per distinct charge."""
    cache = ext.cache
    state, catalogue = cache.state, cache.catalogue
    over = np.zeros(len(sent.rows), np.bool_)
    failed: list[bytes] = []
    never: list[bytes] = []
    if not len(catalogue.quotas.tenant_limits) and not len(catalogue.quotas.class_limits) \
            and not len(catalogue.tenants):
        return over, failed, never
    charges = node_charges(state, asks, device_masks(cache.dra), cache.dra,
                           catalogue.classes, cache.modes.dra_mask(state))
    distinct, which = charges.distinct(sent.rows)
    for d, amounts in enumerate(distinct):
        reason = quota_refusal(catalogue, request.tenant, request.key, amounts)
        if reason is None:
            continue
        log.info("filter-claims: pod %s refused where its claims could take %s: %s",
                 request.key, amounts[0], reason.message)
        here = which == d
        over |= here
        out = never if reason.permanent else failed
        why = member("", PREFIX + reason.message)[2:]  # ':"sentence"', rendered once
        out += [msgspec.json.encode(n) + why for n in _names(state, sent, np.flatnonzero(here))]
    if over.any():
        ext.metrics.failures.labels(Check.QUOTA.value).inc(int(over.sum()))
    return over, failed, never


def outside_permission(ext: Host, request: PodRequest, c: Constraints, asks: ClaimAsks,
                       sent: Matched) -> IntArray:
    """[sent] -> the first request (index into ``asks.requests``) of which some alternative
    selects, with its selectors and class, a GPU of the node that the tenant's
    GPUPermission does not permit; -1: none does. kube-scheduler's allocator may take any
    device a request selects (``ExactCount`` its first that fits, ``All`` every one, a
    ``firstAvailable`` any alternative), so such a node could give the tenant a GPU it may
    not use."""
    out = np.full(len(sent.rows), -1, np.int64)
    cache = ext.cache
    state = cache.state
    permitted = cache.catalogue.permissions.mask(state, request.tenant)
    if c.permission is None or permitted is None:
        return out
    masks, dra_rows = device_masks(cache.dra), cache.modes.dra_mask(state)
    first = np.full(len(state.nodes), -1, np.int64)
    for r, ask in enumerate(asks.requests):
        for choice in ask.choices:
            cls = cache.catalogue.classes.request_mask(state, choice.gpu_class, None) \
                if choice.gpu_class else None
            allowed = masks.allowed(state, cache.dra, dra_rows, choice.selectors, cls,
                                    ask.claim)
            first[(first < 0) & (allowed & ~permitted).any(axis=1)] = r
    known = sent.rows >= 0
    out[known] = first[sent.rows[known]]
    return out


def wider_than_permission(claim: str, permission: str) -> str:
    """Why a node is refused where a claim selects a GPU outside the tenant's permission."""
    return (f"{PREFIX}ResourceClaim {claim} selects GPUs on this node outside {permission} "
            "(its selectors and DeviceClass), and kube-scheduler may allocate any GPU it "
            "selects: select only permitted GPUs (a CEL selector on their model, or the "
            "DeviceClass of a ResourceClass within the permission)")


def _joined(members: bytes, more: list[bytes]) -> bytes:
    """A rendered JSON object of members with ``more`` members added."""
    if not more:
        return members
    inner = members[1:-1]
    return members_json(([inner] if inner else []) + more)


def _names(state: ClusterState, sent: Matched, positions: IntArray) -> list[str]:
    """The names of the sent nodes at ``positions``."""
    rows = sent.rows
    return [state.nodes[int(rows[k])].name if rows[k] >= 0 else sent.names[int(k)]
            for k in positions.tolist()]


def _refuse_all(args: protocol.ExtenderArgs, names: Sequence[str], why: str, permanent: bool
                ) -> bytes:
    every = members_json([member(n, why) for n in names])
    failed, unresolvable = (protocol.NO_NODES, every) if permanent else \
        (every, protocol.NO_NODES)
    empty = b"[]" if args.cache_capable else b""
    return protocol.filter_answer(args, empty, [], failed, unresolvable)
