"""List + watch of every kind the cache needs, started in rebuild order.

Order matters only for speed at start: nodes and GPUDevices first (the
layout), then classes, groups and ledgers, then pods, whose decision
annotations re-create every allocation (the rebuild). Each informer is
started once the previous one has listed, so the state is laid out once.
PodDisruptionBudgets come last and are not waited for: only preemption reads them,
and it does nothing until they are listed; nor are PodGroups (when asked for): the
members of a gang whose PodGroup is not known yet wait.

``long_lived`` is for the process that owns the cache: the rebuild creates about a
million objects that live as long as the process, and Python's cyclic garbage
collector, left on, walks the growing heap again and again while they arrive (at
5,000 nodes / 50,000 pods: 1.0-1.3 s of a 3.3-3.8 s rebuild, ``bench_extender``).
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

from gpupool.extender.state.cache import ClusterCache
from gpupool.kube.api import DraApi, KubeApi, Listing
from gpupool.kube.errors import NotFound
from gpupool.kube.informer import Feed, Informer

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Feeds:
    informers: tuple[Informer[Any], ...]

    def stop(self, timeout_s: float = 10.0) -> None:
        for informer in self.informers:
            informer.signal_stop()
        deadline = time.monotonic() + timeout_s
        for informer in self.informers:
            informer.join(max(0.0, deadline - time.monotonic()))


LENIENT = ("tenantquotas", "gpupermissions")
"""Kinds whose listing is waited for only ``LENIENT_SYNC_S``. A cluster upgraded without
their CRDs (Helm installs new CRDs only on install) answers 404: then none can exist, the
listing counts as empty and the extender serves; their informers keep retrying and apply
them once the CRD is there. Any other failure (403 from a mis-bound role, 500, no answer)
leaves them unlisted: the extender starts but stays unready (``Extender.ready``) until a
listing succeeds, so that no tenant a GPUPermission confines is placed anywhere."""
LENIENT_SYNC_S = 10.0


def _absent_is_empty(feed: Feed[Any]) -> Feed[Any]:
    """``feed`` whose listing answers "no objects" when the kind's CRD is absent (404)."""
    def listing(api: KubeApi) -> Listing[Any]:
        try:
            return feed.list(api)
        except NotFound:
            log.warning("%s: the API server does not serve them (is the CRD applied? "
                        "charts/gpupool/crds): none can exist", feed.name)
            return Listing([], "")
    return Feed(feed.name, listing, feed.watch)


def start_feeds(api: KubeApi, cache: ClusterCache, watch_timeout_s: int = 300,
                sync_timeout_s: float = 120.0, pod_groups: bool = False,
                lenient_sync_s: float = LENIENT_SYNC_S) -> Feeds:
    """Start the informers one after another; raise ``TimeoutError`` if one cannot list.
    ``pod_groups``: watch PodGroups too (a cluster with the PodGroup API, docs/gangs.md);
    ``lenient_sync_s``: how long the ``LENIENT`` kinds are waited for."""
    plan: list[tuple[Feed[Any], Any, Any]] = [
        (Feed("nodes", lambda a: a.list_nodes(), lambda a, rv, t: a.watch_nodes(rv, t)),
         cache.sync_nodes, cache.node_event),
        (Feed("gpudevices", lambda a: a.list_gpu_devices(),
              lambda a, rv, t: a.watch_gpu_devices(rv, timeout_s=t)),
         cache.sync_devices, cache.device_event),
        (Feed("resourceclasses", lambda a: a.list_resource_classes(),
              lambda a, rv, t: a.watch_resource_classes(rv, t)),
         cache.sync_classes, cache.class_event),
        (Feed("resourcegroups", lambda a: a.list_resource_groups(),
              lambda a, rv, t: a.watch_resource_groups(rv, t)),
         cache.sync_groups, cache.group_event),
        (Feed("tenantquotas", lambda a: a.list_tenant_quotas(),
              lambda a, rv, t: a.watch_tenant_quotas(rv, t)),
         cache.sync_tenant_quotas, cache.tenant_quota_event),
        (Feed("gpupermissions", lambda a: a.list_gpu_permissions(),
              lambda a, rv, t: a.watch_gpu_permissions(rv, t)),
         cache.sync_permissions, cache.permission_event),
        (Feed("gpuledgers", lambda a: a.list_ledgers(),
              lambda a, rv, t: a.watch_ledgers(rv, t)),
         cache.sync_ledgers, cache.ledger_event),
        (Feed("pods", lambda a: a.list_pod_summaries(),
              lambda a, rv, t: a.watch_pod_summaries(rv, timeout_s=t)),
         cache.sync_pods, cache.pod_event),
    ]
    started: list[Informer[Any]] = []
    for feed, on_sync, on_event in plan:
        lenient = feed.name in LENIENT
        informer = Informer(api, _absent_is_empty(feed) if lenient else feed, on_sync,
                            on_event, watch_timeout_s).start()
        started.append(informer)
        if lenient:
            if not informer.synced.wait(min(sync_timeout_s, lenient_sync_s)):
                log.error("could not list %s within %.0fs (does the extender's role allow "
                          "it? see its warnings): unready until they are listed",
                          feed.name, min(sync_timeout_s, lenient_sync_s))
            continue
        if not informer.synced.wait(sync_timeout_s):
            Feeds(tuple(started)).stop()
            raise TimeoutError(f"could not list {feed.name} within {sync_timeout_s:.0f}s")
    # not waited for: only preemption reads the budgets, and it waits for their listing
    budgets: Feed[Any] = Feed("poddisruptionbudgets", lambda a: a.list_disruption_budgets(),
                              lambda a, rv, t: a.watch_disruption_budgets(rv, t))
    started.append(Informer(api, budgets, cache.sync_budgets, cache.budget_event,
                            watch_timeout_s).start())
    if pod_groups:  # not waited for: a gang's members wait until its PodGroup is known
        groups: Feed[Any] = Feed("podgroups", lambda a: a.list_pod_groups(),
                                 lambda a, rv, t: a.watch_pod_groups(rv, t))
        started.append(Informer(api, _absent_is_empty(groups), cache.sync_pod_groups,
                                cache.pod_group_event, watch_timeout_s).start())
    started += start_claim_feeds(api, cache, watch_timeout_s)
    return Feeds(tuple(started))


def start_claim_feeds(api: KubeApi, cache: ClusterCache, watch_timeout_s: int = 300
                      ) -> list[Informer[Any]]:
    """ResourceSlices and ResourceClaims (resource.k8s.io/v1), when ``api`` speaks DRA.

    Not waited for: a cluster without the API (before Kubernetes 1.34) answers 404 and the
    informers keep retrying with a warning, while the device-plugin path serves on; DRA
    pods' scores count the claims once they are listed."""
    if not isinstance(api, DraApi):
        return []
    dra = cache.dra

    def locked(handler: Callable[..., None]) -> Callable[..., None]:
        def call(*args: Any) -> None:
            with cache.lock:
                handler(cache, *args)
        return call

    slices: Feed[Any] = Feed(  # an informer's connection is a fork: a DraApi too
        "resourceslices", lambda a: cast(DraApi, a).list_all_resource_slices(),
        lambda a, rv, t: cast(DraApi, a).watch_resource_slices(rv, t))
    claims: Feed[Any] = Feed(
        "resourceclaims", lambda a: cast(DraApi, a).list_resource_claims(),
        lambda a, rv, t: cast(DraApi, a).watch_resource_claims(rv, t))
    return [Informer(api, slices, locked(dra.sync_slices), locked(dra.slice_event),
                     watch_timeout_s).start(),
            Informer(api, claims, locked(dra.sync_claims), locked(dra.claim_event),
                     watch_timeout_s).start()]


@contextmanager
def long_lived() -> Iterator[None]:
    """The cyclic garbage collector paused while the block builds what the process keeps
    (the cache's rebuild, warmed tables), and all of it then frozen (``gc.freeze``) so
    that no later full collection walks it again. Objects still go as soon as nothing
    refers to them; only cycles made inside the block are never collected. The collector
    is enabled again after the block if it was before, whatever the block raised."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
