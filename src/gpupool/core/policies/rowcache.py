"""Per-node values a policy worked out, kept while the node's ``state.version`` holds.

A policy's score of a node for a given request shape depends only on that
node's row of the state (and on layout facts such as the largest node), so
it stays valid until the row's version moves. ``RowCaches`` holds one
``RowCache`` per shape key, least recently used first out; a cache made for
another layout (``state.layout``) is never reused. A key may name a mask
object by ``id``: the cache holds the object (``basis``), so the identity
cannot be handed to another object while the cache lives.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpupool.core.state import ClusterState, IntArray

SHAPES = 128


@dataclass(slots=True)
class RowCache:
    layout: object
    basis: object
    seen: IntArray
    columns: dict[str, np.ndarray]

    @staticmethod
    def fresh(state: ClusterState, columns: Mapping[str, npt.DTypeLike],
              basis: object = None) -> RowCache:
        n = len(state.nodes)
        return RowCache(state.layout, basis, np.full(n, -1, np.int64),
                        {name: np.zeros(n, dtype) for name, dtype in columns.items()})

    def stale(self, state: ClusterState, rows: IntArray) -> IntArray:
        """The rows among ``rows`` whose values are missing or out of date."""
        return np.asarray(rows[self.seen[rows] != state.version[rows]], np.int64)

    def store(self, state: ClusterState, rows: IntArray, **values: np.ndarray) -> None:
        for name, value in values.items():
            self.columns[name][rows] = value
        self.seen[rows] = state.version[rows]

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]


class RowCaches:
    """``RowCache``s by shape key (use under the state's lock)."""

    def __init__(self, columns: Mapping[str, npt.DTypeLike], shapes: int = SHAPES):
        self.columns = dict(columns)
        self.shapes = shapes
        self._caches: OrderedDict[tuple[object, ...], RowCache] = OrderedDict()

    def get(self, state: ClusterState, key: tuple[object, ...], basis: object = None
            ) -> RowCache:
        cache = self._caches.get(key)
        if cache is None or cache.layout is not state.layout:
            cache = self._caches[key] = RowCache.fresh(state, self.columns, basis)
            while len(self._caches) > self.shapes:
                self._caches.popitem(last=False)
        self._caches.move_to_end(key)
        return cache
