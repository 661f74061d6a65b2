"""Prioritize for pods whose GPUs come from ResourceClaims: gpupool's policy ranks DRA nodes.

kube-scheduler's DRA plugin filters the nodes and allocates the claims (first fit among a
node's devices); nothing in it looks at how a node's GPUs are fragmented. This verb gives
it gpupool's view: the pod's unallocated claims become a core ``PodRequest``
(``drapods``), the candidates are the DRA nodes among those sent where it fits
(``NodeModes.for_claims``) on the one ``ClusterState`` that holds both paths' allocations,
and the scores are the configured policy's — the very ``Placer.score`` the device-plugin
path uses — scaled to 0..10. Nodes that score 0, that are not DRA nodes, or where the
claims do not fit are left out of the answer (kube-scheduler adds nothing for them).

Claims with CEL selectors, ``allocationMode: All``, ``firstAvailable`` alternatives or
``matchAttribute`` constraints (``draasks.ClaimAsks.plain`` is False) are read as the
allocator reads them (``draselect.fitting``): only nodes where the selected devices can
hold them are candidates, grouped by how they would be satisfied there, each group scored
with its own request, and all scaled together.

A pod without claims of gpupool's driver, or whose claims are all allocated already, gets
an empty answer. kube-scheduler calls this only through an extender entry without
``managedResources`` (docs/dra.md says how to configure it).
"""

from __future__ import annotations

import logging
import weakref

import numpy as np

from gpupool.core.errors import GpupoolError
from gpupool.core.fit import Constraints
from gpupool.core.request import PodRequest
from gpupool.core.state import BoolArray, IntArray
from gpupool.extender.dra.draasks import ClaimAsks, claim_asks
from gpupool.extender.dra.drapods import claims_request, has_claims
from gpupool.extender.dra.draselect import DeviceMasks, fitting
from gpupool.extender.dra.host import Host
from gpupool.extender.state.draclaims import DraClaims
from gpupool.extender.wire import protocol
from gpupool.extender.wire.nodenames import scaled

log = logging.getLogger(__name__)
_MASKS: weakref.WeakKeyDictionary[DraClaims, DeviceMasks] = weakref.WeakKeyDictionary()


def claim_priorities(ext: Host, args: protocol.ExtenderArgs, base: PodRequest) -> bytes:
    """``HostPriorityList`` JSON for a pod whose GPUs come from ResourceClaims."""
    if not has_claims(args.pod):
        return protocol.NO_PRIORITIES
    cache = ext.cache
    with cache.lock:
        cache.flush()
        classes = frozenset(cache.catalogue.classes.names())
        try:
            request = claims_request(args.pod, base, cache.dra, classes)
            asks = claim_asks(args.pod, base, cache.dra, classes)
        except GpupoolError as exc:
            log.info("prioritize: %s", exc)
            ext.metrics.decisions.labels("prioritize", "error").inc()
            return protocol.NO_PRIORITIES
        if not asks.requests:
            return protocol.NO_PRIORITIES
        state = cache.state
        table = ext._table(state)
        try:
            sent = table.match(args.names_json) if args.names is None else \
                table.match_names(args.names)
        except GpupoolError as exc:
            log.info("prioritize: %s", exc)
            return protocol.NO_PRIORITIES
        rows = sent.rows if sent.all_known else sent.rows[sent.rows >= 0]
        keep = np.zeros(len(state.nodes), np.bool_)
        keep[rows] = True
        try:
            if asks.plain:
                indices, values = _plain(ext, request, keep)
            else:
                indices, values = _selective(ext, asks, base, keep)
        except GpupoolError as exc:  # e.g. an All request past the GPUs a pod may ask
            log.info("prioritize: pod %s: %s", base.key, exc)
            ext.metrics.decisions.labels("prioritize", "error").inc()
            return protocol.NO_PRIORITIES
        if indices.size == 0:
            return protocol.NO_PRIORITIES
        full = np.zeros(len(state.nodes), np.int64)
        full[indices] = scaled(values)
        scores = full[rows]
        positive = scores > 0
        answer = table.priorities_json(rows[positive], scores[positive])
    ext.metrics.decisions.labels("prioritize", "claims").inc()
    return answer


def _plain(ext: Host, request: PodRequest, keep: BoolArray) -> tuple[IntArray, np.ndarray]:
    """Candidates and policy values of claims that ask plain GPUs (one core request)."""
    state, cache = ext.cache.state, ext.cache
    c = cache.modes.for_claims(state, request, cache.catalogue)
    cands = ext.placer.candidates(state, request, c).among(keep)
    if cands.indices.size == 0:
        return cands.indices, np.zeros(0)
    return cands.indices, np.asarray(ext.placer.score(state, request, cands, ext.rng).value)


def _selective(ext: Host, asks: ClaimAsks, base: PodRequest, keep: BoolArray
               ) -> tuple[IntArray, np.ndarray]:
    """Candidates and policy values of claims with selectors, ``All``, alternatives or
    constraints: each group of nodes (``draselect.fitting``) scored with its request."""
    cache = ext.cache
    state = cache.state
    groups = fitting(state, asks, base, device_masks(cache.dra), cache.dra,
                     cache.catalogue.classes, cache.modes.dra_mask(state))
    indices, values = [], []
    for group in groups:
        c = Constraints(node_mask=group.nodes, gpu_mask=group.gpus)
        cands = ext.placer.candidates(state, group.request, c).among(keep)
        if cands.indices.size:
            indices.append(cands.indices)
            values.append(np.asarray(ext.placer.score(state, group.request, cands,
                                                      ext.rng).value, np.float64))
    if not indices:
        return np.zeros(0, np.int64), np.zeros(0)
    return np.concatenate(indices), np.concatenate(values)


def device_masks(claims: DraClaims) -> DeviceMasks:
    """The selector masks kept for ``claims`` (one per cluster cache)."""
    masks = _MASKS.get(claims)
    if masks is None:
        masks = _MASKS[claims] = DeviceMasks()
    return masks


def claims_priorities_json(ext: Host, body: bytes) -> bytes:
    """The ``prioritize-claims`` verb: scores for pods whose GPUs come from ResourceClaims
    only. The extender entry without ``managedResources`` that calls it is called for every
    pod; a pod that asks gpupool's extended resources is answered empty here (the
    ``prioritize`` verb of the main entry scores it), so no pod is scored twice."""
    try:
        args = protocol.read_args(body, "prioritize-claims")
        base = ext._request(args.pod, args.pod_json)
    except GpupoolError as exc:
        log.info("prioritize-claims: %s", exc)
        ext.metrics.decisions.labels("prioritize", "error").inc()
        return protocol.NO_PRIORITIES
    if base.gpus:
        return protocol.NO_PRIORITIES
    return claim_priorities(ext, args, base)
