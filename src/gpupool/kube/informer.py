"""List + watch as a resilient feed: ``Informer`` keeps a handler in step with one kind.

The informer lists, hands the whole list to ``on_sync`` (the handler replaces
what it knew of that kind), then watches from the list's resourceVersion and
hands each event to ``on_event``. The watch goes on from the last resourceVersion
seen each time the server ends a watch request (``watch_timeout_s``); on 410 Gone
or any error — a watch the server stopped answering among them — it lists again
(after a back-off for errors). ``stop()`` closes the informer's own connection,
which ends a watch that is waiting for events at once.

Handlers run on the informer's thread; they take their own lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from gpupool.kube.api import KubeApi, Listing
from gpupool.kube.errors import Gone, KubeError

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Feed(Generic[T]):
    """How to list and watch one kind on a given ``KubeApi``."""

    name: str
    list: Callable[[KubeApi], Listing[T]]
    watch: Callable[[KubeApi, str, int], Iterator[tuple[str, T]]]


def resource_version_of(obj: Any) -> str:
    """The resourceVersion of a typed model or a dict object ('' if absent)."""
    if isinstance(obj, dict):
        return str((obj.get("metadata") or {}).get("resourceVersion") or "")
    meta = getattr(obj, "metadata", None)
    return str(getattr(meta, "resourceVersion", "") or "")


class Informer(Generic[T]):
    """Runs one ``Feed`` on a thread of its own until ``stop()``."""

    def __init__(self, api: KubeApi, feed: Feed[T], on_sync: Callable[[list[T]], None],
                 on_event: Callable[[str, T], None], watch_timeout_s: int = 300,
                 backoff_s: float = 1.0):
        self._api = api.fork()
        self.feed = feed
        self.on_sync = on_sync
        self.on_event = on_event
        self.watch_timeout_s = watch_timeout_s
        self.backoff_s = backoff_s
        self.synced = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"informer-{feed.name}",
                                        daemon=True)
        self.errors = 0

    def start(self) -> Informer[T]:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop and wait up to ``timeout_s`` for the thread (closing the connection ends a
        watch blocked on a quiet stream; a handler still running is waited for)."""
        self.signal_stop()
        self._thread.join(timeout=timeout_s)

    def signal_stop(self) -> None:
        """Ask the informer to stop without waiting (stop many at once, then ``join``)."""
        self._stopping.set()
        self._api.close()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                rv = self._sync()
                while not self._stopping.is_set():
                    rv = self._follow(rv)
            except Gone:
                log.info("%s: watch expired, listing again", self.feed.name)
            except KubeError as exc:
                if self._stopping.is_set():
                    return
                self.errors += 1
                log.warning("%s: %s; listing again in %.1fs", self.feed.name, exc, self.backoff_s)
                self._stopping.wait(self.backoff_s)
                self._api.close()
                self._api = self._api.fork()

    def _sync(self) -> str:
        listing = self.feed.list(self._api)
        self.on_sync(listing.items)
        self.synced.set()
        return listing.resource_version

    def _follow(self, rv: str) -> str:
        for kind, obj in self.feed.watch(self._api, rv, self.watch_timeout_s):
            if self._stopping.is_set():
                break
            rv = resource_version_of(obj) or rv
            self.on_event(kind, obj)
        return rv
