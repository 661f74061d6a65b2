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
from dataclasses import dataclass

import numpy as np

from gpupool.core.books import NamedBook
from gpupool.core.errors import InvalidInput
from gpupool.core.model import Gpu
from gpupool.core.selector import Selector
from gpupool.core.state import BoolArray, ClusterState

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


def selector_mask(state: ClusterState, selector: Selector) -> BoolArray:
    """[node, gpu position] -> the GPU exists and its labels match ``selector``.

    GPUs with equal facts (model, memory, index, labels, MIG role) share one evaluation.
    """
    mask = np.zeros(state.present.shape, np.bool_)
    seen: dict[tuple[object, ...], bool] = {}
    for i, node in enumerate(state.nodes):
        for j, gpu in enumerate(node.gpus):
            facts = (gpu.model, gpu.memory_mib, gpu.index, gpu.labels, gpu.mig)
            hit = seen.get(facts)
            if hit is None:
                hit = seen[facts] = selector.matches(gpu.label_map())
            mask[i, j] = hit
    return mask


class ClassCatalog(NamedBook[ResourceClass, BoolArray]):
    """The known resource classes by name, with their GPU masks cached per epoch."""

    noun = "resource class"

    def names(self) -> list[str]:
        return sorted(self._items)

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
