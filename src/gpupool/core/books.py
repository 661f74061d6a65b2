"""Books of named objects whose GPU masks are cached per cluster epoch.

Resource classes, resource groups and permissions are each kept by name, and each
computes masks over the cluster's GPUs that stay valid until the cluster's layout
(``ClusterState.epoch``) or the book itself changes. ``NamedBook`` holds the objects
and the cache, and empties the cache whenever an object is added, replaced or removed;
``MaskCache`` is the per-epoch table.

Pure: no I/O.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import ClassVar, Generic, Protocol, TypeVar

from gpupool.core.errors import UnknownName
from gpupool.core.state import BoolArray, ClusterState

V = TypeVar("V")


class Named(Protocol):
    """Anything with a name: what a ``NamedBook`` keeps."""

    @property
    def name(self) -> str: ...


T = TypeVar("T", bound=Named)


class MaskCache(Generic[V]):
    """Values computed for one ``ClusterState`` at one epoch; anything else starts afresh.

    Holds the state weakly, so a cache never keeps an old state alive nor mistakes
    a new state that happens to reuse an old one's ``id``.
    """

    def __init__(self) -> None:
        self._state: weakref.ref[ClusterState] | None = None
        self._epoch = -1
        self._values: dict[object, V] = {}

    def masks_for(self, state: ClusterState) -> dict[object, V]:
        """The table valid for ``state`` now (emptied when state or epoch changed)."""
        if self._state is None or self._state() is not state or self._epoch != state.epoch:
            self._state = weakref.ref(state)
            self._epoch = state.epoch
            self._values = {}
        return self._values

    def clear(self) -> None:
        self._values = {}


class NamedBook(Generic[T, V]):
    """Objects by name, with a ``MaskCache`` emptied on every ``put`` and ``remove``.

    ``noun`` names the kind of object in the error ``get`` raises for an unknown name.
    ``_intersect`` keeps the intersections of a book's masks with masks from elsewhere.
    """

    noun: ClassVar[str] = "object"

    def __init__(self, items: Iterable[T] = ()) -> None:
        self._items: dict[str, T] = {}
        self._cache: MaskCache[V] = MaskCache()
        self._within: MaskCache[BoolArray] = MaskCache()
        for item in items:
            self.put(item)

    def put(self, item: T) -> None:
        """Add an object or replace the one of the same name (an update)."""
        self._items[item.name] = item
        self._cache.clear()
        self._within.clear()

    def remove(self, name: str) -> T | None:
        """Forget ``name``; the object it named, or None if there was none."""
        self._cache.clear()
        self._within.clear()
        return self._items.pop(name, None)

    def get(self, name: str) -> T:
        """The object named ``name``; ``UnknownName`` (listing the known names) if none."""
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "none"
            raise UnknownName(f"{self.noun} {name} does not exist (known: {known})") from None

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __len__(self) -> int:
        return len(self._items)

    def _intersect(self, state: ClusterState, owner: str | None, mask: BoolArray,
                   gpu_mask: BoolArray) -> BoolArray:
        """``mask & gpu_mask``: one read-only object per (``owner``, ``gpu_mask``) and epoch
        (scorers key their caches on a mask's identity). ``gpu_mask`` is held here, so its
        ``id`` stays its own while the entry lives."""
        table = self._within.masks_for(state)
        key = ("within", owner, id(gpu_mask))
        found = table.get(key)
        if found is None or table.get(("held", owner, id(gpu_mask))) is not gpu_mask:
            found = table[key] = mask & gpu_mask
            found.flags.writeable = False
            table["held", owner, id(gpu_mask)] = gpu_mask
        return found
