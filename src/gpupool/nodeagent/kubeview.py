"""The node agent's ``PodApi`` and ``InventoryApi`` on gpupool's one Kubernetes client.

``KubePods`` keeps a watch-fed cache of the node's pods (``start``) so an
Allocate usually reads no list; the allocator asks for a fresh list whenever
the cache could be the reason it cannot serve (see ``allocator``). Writes go
straight to the API server with the pod's resourceVersion as precondition,
and their answers update the cache at once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from gpupool.core.errors import GpupoolError
from gpupool.kube.api import KubeApi
from gpupool.kube.informer import Feed, Informer
from gpupool.nodeagent.pods import Pod, pod_from_json

log = logging.getLogger(__name__)
MEMO_LIMIT = 10_000
COMPONENT = "gpupool-node-agent"


class KubePods:
    """Pods bound to one node: cached (watch) or fresh (list); CAS writes of annotations."""

    def __init__(self, api: KubeApi):
        self.api = api
        self._lock = threading.Lock()
        self._cache: dict[str, Pod] = {}
        self._memo: dict[tuple[str, str], Pod] = {}
        self._informer: Informer[Any] | None = None

    def start(self, node: str) -> None:
        """Keep a cache of ``node``'s pods from a watch (until ``stop``).

        The first list runs here, on the caller's thread, before any other thread
        decodes pods: msgspec (under lightkube) crashes the process when two
        threads decode a type for the first time at once.
        """
        self._on_sync(self.api.list_pods(node).items)
        feed: Feed[Any] = Feed(f"pods-on-{node}", lambda api: api.list_pods(node),
                               lambda api, rv, t: api.watch_pods(rv, node, t))
        self._informer = Informer(self.api, feed, self._on_sync, self._on_event).start()

    def stop(self, wait: bool = True) -> None:
        """Stop the watch. Its thread may sit in a read until the server sends
        something; ``wait=False`` does not wait for it (at process exit)."""
        informer, self._informer = self._informer, None
        if informer is None:
            return
        if wait:
            informer.stop()
        else:
            threading.Thread(target=informer.stop, daemon=True).start()

    def node_pods(self, node: str, fresh: bool = True) -> list[Pod]:
        if not fresh and self._informer is not None and self._informer.synced.is_set():
            with self._lock:
                return list(self._cache.values())
        return [self._parse(p) for p in self.api.list_pods(node).items]

    def patch_annotations(self, pod: Pod, annotations: Mapping[str, str | None]) -> Pod:
        new = self._parse(self.api.patch_pod_annotations(
            pod.namespace, pod.name, dict(annotations), pod.resource_version))
        self._remember(new)
        return new

    # -- the cache ------------------------------------------------------------------------
    def _parse(self, obj: Any) -> Pod:
        meta = obj.metadata
        key = (str(meta.uid), str(meta.resourceVersion))
        pod = self._memo.get(key)
        if pod is None:
            pod = pod_from_json(obj.to_dict())
            if len(self._memo) > MEMO_LIMIT:
                self._memo.clear()
            self._memo[key] = pod
        return pod

    def _remember(self, pod: Pod) -> None:
        with self._lock:
            held = self._cache.get(pod.uid)
            if held is None or _rv(held) <= _rv(pod):
                self._cache[pod.uid] = pod

    def _on_sync(self, items: list[Any]) -> None:
        pods = [self._parse(o) for o in items]
        with self._lock:
            self._cache = {p.uid: p for p in pods}

    def _on_event(self, kind: str, obj: Any) -> None:
        pod = self._parse(obj)
        if kind == "DELETED":
            with self._lock:
                self._cache.pop(pod.uid, None)
            return
        self._remember(pod)


def _rv(pod: Pod) -> int:
    try:
        return int(pod.resource_version)
    except ValueError:
        return 0


class KubeInventory:
    """This node's ``GPUDevice`` objects."""

    def __init__(self, api: KubeApi):
        self.api = api

    def list_devices(self, node: str) -> list[dict[str, Any]]:
        return [dict(o) for o in self.api.list_gpu_devices(node).items]

    def create_device(self, body: Mapping[str, Any]) -> None:
        self.api.create_gpu_device(body)

    def replace_device(self, body: Mapping[str, Any]) -> None:
        self.api.update_gpu_device(body)

    def update_device_status(self, name: str, status: Mapping[str, Any]) -> None:
        self.api.patch_gpu_device_status(name, status)

    def delete_device(self, name: str) -> None:
        self.api.delete_gpu_device(name)


class KubeEvents:
    """Events about pods, from this node's agent."""

    def __init__(self, api: KubeApi, node: str,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)):
        self.api = api
        self.node = node
        self.clock = clock

    def pod_event(self, pod: Pod, reason: str, message: str, warning: bool = True) -> None:
        try:
            self.api.create_pod_event(pod.namespace, pod.name, pod.uid, reason, message,
                                      warning, COMPONENT, self.node, self.clock())
        except GpupoolError as exc:
            log.warning("could not record Event %s about pod %s: %s", reason, pod.ref, exc)

    def device_event(self, name: str, reason: str, message: str, warning: bool) -> None:
        """An Event about a GPUDevice (MIG repartitions); failures are logged."""
        try:
            self.api.create_device_event(name, "", reason, message, warning, COMPONENT,
                                         self.node, self.clock())
        except GpupoolError as exc:
            log.warning("could not record Event %s about GPUDevice %s: %s", reason, name, exc)


class KubeEvictions:
    """Evictions through the Eviction API."""

    def __init__(self, api: KubeApi):
        self.api = api

    def evict(self, pod: Pod) -> None:
        self.api.evict_pod(pod.namespace, pod.name)
