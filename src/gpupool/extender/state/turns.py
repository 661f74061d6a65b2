"""Turns: one writer at a time per record (a node's GPULedger, a quota scope's
QuotaLedger) among this replica's binds.

kube-scheduler binds many pods at once, and consecutive pods often go to the same node
(a packing policy fills a node before it starts the next) and always to the same
tenant's QuotaLedger. Two of this replica's binds writing one record at once would make
one of them lose the compare-and-swap, read the record again and decide again: two more
round trips to the API server, and more for every further bind in the pile. Taking turns
per record, each bind decides on the version the previous one wrote (the cache holds it
once the write returns), and its write wins unless another replica wrote meanwhile.
Binds on different records never wait for each other.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Turns:
    """A lock per name, made on first use and dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._locks: dict[str, tuple[threading.Lock, int]] = {}  # name -> (lock, users)

    @contextmanager
    def of(self, name: str) -> Iterator[None]:
        """Hold ``name``'s turn for the block (waiting for the one who has it)."""
        with self._lock:
            lock, users = self._locks.get(name) or (threading.Lock(), 0)
            self._locks[name] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._lock:
                users = self._locks[name][1] - 1
                if users:
                    self._locks[name] = (lock, users)
                else:
                    del self._locks[name]

    def waiting(self) -> int:
        """Names with a holder (for tests and metrics)."""
        with self._lock:
            return len(self._locks)
