"""Burst limits of a pod's GPU slices, read from its annotations (docs/design/burst.md).

Kubernetes requires an extended resource's request to equal its limit, so
``gpupool.io/gpu-memory`` and ``gpupool.io/gpu-core`` carry the *request* (what placement
and quotas count) and two pod annotations carry the *limit* (the most a container may use
while its GPU has room):

* ``gpupool.io/gpu-memory-limit``: MiB per GPU, a whole number;
* ``gpupool.io/gpu-core-limit``: percent of one GPU, 1..100.

Either holds one number, which applies to every container that asks a shared slice, or
``<container>=<number>`` pairs separated by commas, one per container that bursts. A limit
below the container's request, a container that asks no shared slice (none, or whole
GPUs), a name that is not a container and a malformed value are refused with
``InvalidInput`` naming the pod, the annotation and the container. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpupool.contract import names
from gpupool.core.errors import InvalidInput, QuantityError
from gpupool.core.model import CORE_UNITS_PER_GPU
from gpupool.core.quantity import to_int
from gpupool.core.request import GpuDemand

MAX_MEMORY_LIMIT_MIB = 16 * 1024 * 1024
"""As for the request: more than 16 TiB per GPU is taken for a unit mistake."""

KEYS = (names.ANNOTATION_MEMORY_LIMIT, names.ANNOTATION_CORE_LIMIT)


def asks_burst(annotations: Mapping[str, Any]) -> bool:
    """Whether the pod carries a burst-limit annotation (a non-empty one)."""
    return any(annotations.get(key) not in (None, "") for key in KEYS)


def with_limits(demands: Sequence[GpuDemand], annotations: Mapping[str, Any],
                containers: Sequence[str], where: str) -> tuple[GpuDemand, ...]:
    """``demands`` with the burst limits the annotations give their containers.

    ``containers`` are the pod's container names (to tell a typo from a container that
    asks no GPU); ``where`` names the pod in errors."""
    out = list(demands)
    for key, memory, top in ((names.ANNOTATION_MEMORY_LIMIT, True, MAX_MEMORY_LIMIT_MIB),
                             (names.ANNOTATION_CORE_LIMIT, False, CORE_UNITS_PER_GPU)):
        value = annotations.get(key)
        if value in (None, ""):
            continue
        for container, limit in _per_container(key, value, out, containers, top, where):
            i = next(n for n, d in enumerate(out) if d.container == container)
            try:
                out[i] = replace(out[i], memory_limit_mib=limit) if memory else \
                    replace(out[i], core_limit_pct=limit)
            except InvalidInput as exc:
                raise InvalidInput(f"{where}: annotation {key}: {exc}") from None
    return tuple(out)


def _per_container(key: str, value: Any, demands: Sequence[GpuDemand],
                   containers: Sequence[str], top: int, where: str
                   ) -> list[tuple[str, int]]:
    shared = [d.container for d in demands if not d.exclusive]
    text = str(value).strip()
    if "=" not in text:
        if not shared:
            raise InvalidInput(f"{where}: annotation {key} is set but no container asks a "
                               "shared GPU slice (whole GPUs have no burst limit)")
        return [(c, _number(key, text, top, where)) for c in shared]
    pairs: list[tuple[str, int]] = []
    for part in text.split(","):
        name, eq, number = (p.strip() for p in part.partition("="))
        if not name or not eq:
            raise InvalidInput(f"{where}: annotation {key}={text!r} must be a number or "
                               "<container>=<number> pairs separated by commas")
        if name in (n for n, _ in pairs):
            raise InvalidInput(f"{where}: annotation {key} names container {name} twice")
        if name not in shared:
            why = "is not a container of the pod" if name not in containers else \
                "asks no shared GPU slice (whole GPUs, or none, have no burst limit)"
            raise InvalidInput(f"{where}: annotation {key}: container {name} {why}")
        pairs.append((name, _number(key, number, top, where)))
    return pairs


def _number(key: str, text: str, top: int, where: str) -> int:
    try:
        number = to_int(text, key)
    except QuantityError as exc:
        raise InvalidInput(f"{where}: annotation {key}: {exc}") from None
    if not 1 <= number <= top:
        raise InvalidInput(f"{where}: annotation {key}={number} must be 1..{top}"
                           + (" (percent of one GPU)" if top == CORE_UNITS_PER_GPU else
                              " (MiB per GPU)"))
    return number
