"""Turns: this replica's writes to one record (a node's GPULedger, a quota scope's
QuotaLedger) one at a time, and the writes that wait for a turn made as one.

kube-scheduler binds many pods at once, and consecutive pods often go to the same node
(a packing policy fills a node before it starts the next) and always to their tenant's
QuotaLedger. Two of this replica's binds writing one record at once would make one of
them lose the compare-and-swap, read the record again and decide again: two more round
trips to the API server, and more for every further bind in the pile. So writers of one
record take turns (``Turns``), and each write is made on the version the previous one
wrote (the cache holds it once the write returns); it wins unless another replica wrote
meanwhile.

Taking turns alone would let one record pass one bind per round trip (40 binds a second
on a node or a tenant at 25 ms a write). So whoever gets the turn writes, in one write,
every item that queued for the record while the previous write was on its way
(``Batches``): the items wait together, for about one round trip, and a burst onto one
record costs one write per round trip, not one per pod. Records of different names never
wait for each other.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


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

    def held(self) -> int:
        """Names someone holds or waits for (none once every writer is done)."""
        with self._lock:
            return len(self._locks)


class BatchFailed(Exception):
    """The write that carried this item failed unexpectedly (its writer has the error)."""


@dataclass(slots=True)
class _Item(Generic[T, R]):
    value: T
    done: bool = False
    result: R | None = None
    error: BaseException | None = None


class Batches(Generic[T, R]):
    """Items for one record, written together by whoever has the record's turn."""

    def __init__(self) -> None:
        self.turns = Turns()
        self._lock = threading.Lock()
        self._queued: dict[str, list[_Item[T, R]]] = {}

    def queued(self, name: str) -> int:
        """Items waiting for ``name``'s next write."""
        with self._lock:
            return len(self._queued.get(name, ()))

    def submit(self, name: str, value: T, write: Callable[[Sequence[T]], Sequence[R]],
               on_turn: Callable[[], None] = lambda: None) -> R:
        """``value``'s result from ``write`` (called with every item queued for ``name``,
        in order, by the thread holding the turn; it returns one result per item).
        ``on_turn`` is called when this thread gets the turn (for timing)."""
        item: _Item[T, R] = _Item(value)
        with self._lock:
            self._queued.setdefault(name, []).append(item)
        with self.turns.of(name):
            on_turn()
            if not item.done:
                with self._lock:
                    batch = self._queued.pop(name)
                self._write(batch, write, item)
        if item.error is not None:
            raise item.error
        return item.result  # type: ignore[return-value]  # set with done (R may be None)

    @staticmethod
    def _write(batch: list[_Item[T, R]], write: Callable[[Sequence[T]], Sequence[R]],
               writer: _Item[T, R]) -> None:
        try:
            results = write([i.value for i in batch])
        except Exception as exc:  # a bug: the writer raises it, the others a BatchFailed
            for i in batch:
                i.error = exc if i is writer else BatchFailed(f"{type(exc).__name__}: {exc}")
                i.done = True
            return
        for i, result in zip(batch, results, strict=True):
            i.result, i.done = result, True
