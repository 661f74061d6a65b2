"""List + watch of every kind the cache needs, started in rebuild order.

Order matters only for speed at start: nodes and GPUDevices first (the
layout), then classes, groups and ledgers, then pods, whose decision
annotations re-create every allocation (the rebuild). Each informer is
started once the previous one has listed, so the state is laid out once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gpupool.extender.cache import ClusterCache
from gpupool.kube.api import KubeApi
from gpupool.kube.informer import Feed, Informer


@dataclass(frozen=True, slots=True)
class Feeds:
    informers: tuple[Informer[Any], ...]

    def stop(self, timeout_s: float = 10.0) -> None:
        for informer in self.informers:
            informer.signal_stop()
        deadline = time.monotonic() + timeout_s
        for informer in self.informers:
            informer.join(max(0.0, deadline - time.monotonic()))


def start_feeds(api: KubeApi, cache: ClusterCache, watch_timeout_s: int = 300,
                sync_timeout_s: float = 120.0) -> Feeds:
    """Start the informers one after another; raise ``TimeoutError`` if one cannot list."""
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
        (Feed("gpuledgers", lambda a: a.list_ledgers(),
              lambda a, rv, t: a.watch_ledgers(rv, t)),
         cache.sync_ledgers, cache.ledger_event),
        (Feed("pods", lambda a: a.list_pod_summaries(),
              lambda a, rv, t: a.watch_pod_summaries(rv, timeout_s=t)),
         cache.sync_pods, cache.pod_event),
    ]
    started: list[Informer[Any]] = []
    for feed, on_sync, on_event in plan:
        informer = Informer(api, feed, on_sync, on_event, watch_timeout_s).start()
        started.append(informer)
        if not informer.synced.wait(sync_timeout_s):
            Feeds(tuple(started)).stop()
            raise TimeoutError(f"could not list {feed.name} within {sync_timeout_s:.0f}s")
    return Feeds(tuple(started))
