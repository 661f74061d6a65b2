"""Prioritize for pods whose GPUs come from ResourceClaims: gpupool's policy ranks DRA nodes.

kube-scheduler's DRA plugin filters the nodes and allocates the claims (first fit among a
node's devices); nothing in it looks at how a node's GPUs are fragmented. This verb gives
it gpupool's view: the pod's unallocated claims become a core ``PodRequest``
(``drapods``), the candidates are the DRA nodes among those sent where it fits
(``NodeModes.for_claims``) on the one ``ClusterState`` that holds both paths' allocations,
and the scores are the configured policy's — the very ``Placer.score`` the device-plugin
path uses — scaled to 0..10. Nodes that score 0, that are not DRA nodes, or where the
claims do not fit are left out of the answer (kube-scheduler adds nothing for them).

A pod without claims of gpupool's driver, or whose claims are all allocated already, gets
an empty answer. kube-scheduler calls this only through an extender entry without
``managedResources`` (docs/dra.md says how to configure it).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from gpupool.core.errors import GpupoolError
from gpupool.core.request import PodRequest
from gpupool.extender import protocol
from gpupool.extender.drapods import claims_request, has_claims

if TYPE_CHECKING:
    from gpupool.extender.service import Extender

log = logging.getLogger(__name__)


def claim_priorities(ext: Extender, args: protocol.ExtenderArgs, base: PodRequest) -> bytes:
    """``HostPriorityList`` JSON for a pod whose GPUs come from ResourceClaims."""
    if not has_claims(args.pod):
        return protocol.NO_PRIORITIES
    cache = ext.cache
    with cache.lock:
        cache.flush()
        try:
            request = claims_request(args.pod, base, cache.dra,
                                     frozenset(cache.catalogue.classes.names()))
        except GpupoolError as exc:
            log.info("prioritize: %s", exc)
            ext.metrics.decisions.labels("prioritize", "error").inc()
            return protocol.NO_PRIORITIES
        if not request.gpus:
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
        c = cache.modes.for_claims(state, request, cache.catalogue)
        cands = ext.placer.candidates(state, request, c)
        keep = np.zeros(len(state.nodes), np.bool_)
        keep[rows] = True
        cands = cands.among(keep)
        if cands.indices.size == 0:
            return protocol.NO_PRIORITIES
        values = ext.placer.score(state, request, cands, ext.rng).value
        full = np.zeros(len(state.nodes), np.int64)
        full[cands.indices] = _scaled(values)
        scores = full[rows]
        positive = scores > 0
        answer = table.priorities_json(rows[positive], scores[positive])
    ext.metrics.decisions.labels("prioritize", "claims").inc()
    return answer


def _scaled(values: np.ndarray) -> np.ndarray:
    from gpupool.extender.service import scaled  # the device-plugin path's scaling
    return scaled(values)


def claims_priorities_json(ext: Extender, body: bytes) -> bytes:
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
