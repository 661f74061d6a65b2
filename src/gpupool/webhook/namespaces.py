"""The namespaces' placement settings as the webhook reads them at a review: a view kept by
a watch of namespaces (``informer``), so a review reads memory, not the API server.

A namespace the view does not hold — the first listing has not arrived, or the namespace
is newer than the last event the watch delivered (made a moment before its first pod) —
is read with one GET (``fetch``) for that review, and not remembered: the watch brings
it. A GET that fails gives ``NamespacePlacement.unknown`` with the reason, and
``placement.settle`` refuses only the pods whose placement depends on it. The view keeps
what it was last shown while its watch is down (stale, never empty), as every informer of
gpupool does.

Handlers run on the informer's thread; the look-up on the webhook's worker threads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpupool.core.errors import GpupoolError
from gpupool.kube.api import KubeApi
from gpupool.kube.errors import NotFound
from gpupool.kube.informer import Feed, Informer
from gpupool.webhook.placement import NamespacePlacement

log = logging.getLogger(__name__)

Fetch = Callable[[str], Mapping[str, str]]
"""``namespace -> its labels``; raises ``NotFound`` when there is no such namespace and
another ``GpupoolError`` when it cannot be read."""


class NamespaceView:
    """Each namespace's ``NamespacePlacement``, fed by a watch; ``placement_of`` is the
    webhook's ``NamespaceLookup``."""

    def __init__(self, fetch: Fetch):
        self._fetch = fetch
        self._lock = threading.Lock()
        self._known: dict[str, NamespacePlacement] = {}
        self.synced = threading.Event()

    def placement_of(self, name: str) -> NamespacePlacement:
        with self._lock:
            found = self._known.get(name)
        return found if found is not None else self._read(name)

    def _read(self, name: str) -> NamespacePlacement:
        try:
            labels = self._fetch(name)
        except NotFound:
            return NamespacePlacement.unknown(name, "there is no such namespace")
        except GpupoolError as exc:
            log.warning("namespace %s is not in the watched view and cannot be read: %s",
                        name, exc)
            return NamespacePlacement.unknown(name, str(exc))
        return NamespacePlacement.of_labels(name, labels)

    def sync(self, namespaces: Iterable[Any]) -> None:
        known = dict(_placement(ns) for ns in namespaces)
        with self._lock:
            self._known = known
        self.synced.set()

    def event(self, kind: str, ns: Any) -> None:
        name, found = _placement(ns)
        with self._lock:
            if kind == "DELETED":
                self._known.pop(name, None)
            else:
                self._known[name] = found

    def informer(self, api: KubeApi, watch_timeout_s: int = 300) -> Informer[Any]:
        """An informer (not started) that keeps this view."""
        feed: Feed[Any] = Feed("namespaces", lambda a: a.list_namespaces(),
                               lambda a, rv, t: a.watch_namespaces(rv, t))
        return Informer(api, feed, self.sync, self.event, watch_timeout_s)


def _placement(ns: Any) -> tuple[str, NamespacePlacement]:
    """A Namespace (lightkube's model) as (name, its placement settings)."""
    meta = ns.metadata
    name = str(meta.name)
    return name, NamespacePlacement.of_labels(name, meta.labels)
