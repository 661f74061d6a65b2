"""Resource classes: named label selectors over GPUs, and their GPU masks.

A ``ResourceClass`` selects GPUs by their labels (``Gpu.label_map()``: the
published labels plus the built-in ``gpupool.io/model``, ``gpupool.io/memory``
and ``gpupool.io/index``) with matchLabels and matchExpressions, including
``Gt``/``Lt`` on Kubernetes quantities (``gpupool.io/memory Gt 10Gi``). Pods ask
for ``class.gpupool.io/<class>: N`` — N GPUs of that class — and native
ResourceQuota limits ``requests.class.gpupool.io/<class>`` per namespace.

The GPU mask of a selector depends only on the cluster's layout (GPU labels),
so ``ClassCatalog`` caches it per ``ClusterState.epoch``; health and free room
are checked by ``gpupool.core.fit`` on every decision.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from gpupool.core.errors import InvalidInput, UnknownName
from gpupool.core.model import Gpu
from gpupool.core.selector import Selector
from gpupool.core.state import BoolArray, ClusterState

V = TypeVar("V")

CLASS_RESOURCE_PREFIX = "class.gpupool.io/"
"""Pod resource prefix of classes (the same string as ``gpupool.contract.names``)."""

QUOTA_PREFIX = "requests."
"""Native ResourceQuota key prefix: ``requests.class.gpupool.io/<class>``."""

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")


def check_class_name(name: str) -> str:
    """``name`` if it is a valid class name (lower-case DNS name, at most 63 characters)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidInput(
            f"resource class name {name!r} must be 1-63 lower-case letters, digits, '-' or '.', "
            "starting and ending with a letter or digit"
        )
    return name


def resource_name(class_name: str) -> str:
    """The pod resource of a class: ``a100`` -> ``class.gpupool.io/a100``."""
    return CLASS_RESOURCE_PREFIX + check_class_name(class_name)


def class_of_resource(resource: str) -> str | None:
    """The class a pod resource names, or None if it is not a class resource.

    ``class.gpupool.io/`` with an invalid class name raises ``InvalidInput``.
    """
    if not resource.startswith(CLASS_RESOURCE_PREFIX):
        return None
    return check_class_name(resource[len(CLASS_RESOURCE_PREFIX) :])


@dataclass(frozen=True, slots=True)
class ResourceClass:
    """A named set of GPUs: those whose labels the selector matches."""

    name: str
    selector: Selector = Selector()  # noqa: RUF009 - a frozen value, safe to share

    def __post_init__(self) -> None:
        check_class_name(self.name)

    @property
    def resource_name(self) -> str:
        return resource_name(self.name)

    @property
    def quota_resource_name(self) -> str:
        """What a native ResourceQuota limits: ``requests.class.gpupool.io/<class>``."""
        return QUOTA_PREFIX + self.resource_name

    def matches(self, gpu: Gpu) -> bool:
        return self.selector.matches(gpu.label_map())

    def describe(self) -> str:
        return f"class {self.name} ({self.selector.describe()})"


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


def selector_mask(state: ClusterState, selector: Selector) -> BoolArray:
    """[node, gpu position] -> the GPU exists and its labels match ``selector``.

    GPUs with equal facts (model, memory, index, labels) share one evaluation.
    """
    mask = np.zeros(state.present.shape, np.bool_)
    seen: dict[tuple[object, ...], bool] = {}
    for i, node in enumerate(state.nodes):
        for j, gpu in enumerate(node.gpus):
            facts = (gpu.model, gpu.memory_mib, gpu.index, gpu.labels)
            hit = seen.get(facts)
            if hit is None:
                hit = seen[facts] = selector.matches(gpu.label_map())
            mask[i, j] = hit
    return mask


class ClassCatalog:
    """The known resource classes by name, with their GPU masks cached per epoch."""

    def __init__(self, classes: Iterable[ResourceClass] = ()):
        self._classes: dict[str, ResourceClass] = {}
        self._cache: MaskCache[BoolArray] = MaskCache()
        for c in classes:
            self.put(c)

    def put(self, cls: ResourceClass) -> None:
        """Add or replace a class."""
        self._classes[cls.name] = cls
        self._cache.clear()

    def remove(self, name: str) -> ResourceClass | None:
        self._cache.clear()
        return self._classes.pop(name, None)

    def get(self, name: str) -> ResourceClass:
        try:
            return self._classes[name]
        except KeyError:
            known = ", ".join(sorted(self._classes)) or "none"
            raise UnknownName(f"resource class {name} does not exist (known: {known})") from None

    def __contains__(self, name: object) -> bool:
        return name in self._classes

    def __len__(self) -> int:
        return len(self._classes)

    def names(self) -> list[str]:
        return sorted(self._classes)

    def gpu_mask(self, state: ClusterState, name: str) -> BoolArray:
        """GPUs of class ``name`` (``UnknownName`` if there is no such class). Read-only."""
        return self.selector_mask(state, self.get(name).selector)

    def request_mask(self, state: ClusterState, name: str | None, selector: Selector | None
                     ) -> BoolArray | None:
        """GPUs of class ``name`` (if given) that ``selector`` (if given) matches; None when
        neither restricts. One read-only object per (class, selector) and epoch."""
        if name is None:
            return None if selector is None else self.selector_mask(state, selector)
        if selector is None:
            return self.gpu_mask(state, name)
        masks = self._cache.masks_for(state)
        mask = masks.get((name, selector))
        if mask is None:
            mask = self.gpu_mask(state, name) & self.selector_mask(state, selector)
            mask.flags.writeable = False
            masks[name, selector] = mask
        return mask

    def selector_mask(self, state: ClusterState, selector: Selector) -> BoolArray:
        """GPUs ``selector`` matches, cached per state epoch. Read-only: do not modify."""
        masks = self._cache.masks_for(state)
        mask = masks.get(selector)
        if mask is None:
            mask = masks[selector] = selector_mask(state, selector)
            mask.flags.writeable = False
        return mask
