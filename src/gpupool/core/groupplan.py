"""Building tenant resource groups automatically: from each tenant's
estimated demand (``DemandEstimate``: GPUs, optionally of one model) and the cluster's
healthy GPUs, ``build_groups`` carves one group per tenant and model, taking whole
nodes first, and reports the GPUs it could not find (``GroupPlan.unmet``). The groups
are ordinary ``groups.ResourceGroup`` values.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpupool.core.errors import InvalidInput
from gpupool.core.groups import ResourceGroup
from gpupool.core.model import Gpu, Node


@dataclass(frozen=True, slots=True)
class DemandEstimate:
    """A tenant's estimated need: ``gpus`` GPUs of ``model`` (None: any model)."""

    tenant: str
    gpus: int
    model: str | None = None

    def __post_init__(self) -> None:
        if not self.tenant:
            raise InvalidInput("a demand estimate needs a tenant")
        if self.gpus <= 0:
            raise InvalidInput(f"tenant {self.tenant}: estimated GPUs must be > 0, got {self.gpus}")


@dataclass(frozen=True, slots=True)
class GroupPlan:
    """Groups built automatically, and the GPUs per tenant that could not be found."""

    groups: tuple[ResourceGroup, ...]
    unmet: tuple[tuple[str, int], ...] = ()


def slug(text: str) -> str:
    """A lower-case DNS-label fragment of ``text`` (``A100-SXM4-80GB`` -> ``a100-sxm4-80gb``)."""
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return s[:40].strip("-") or "any"


def build_groups(
    nodes: Sequence[Node],
    estimates: Sequence[DemandEstimate],
    permitted: Mapping[str, frozenset[str]] | None = None,
    shared: bool = True,
) -> GroupPlan:
    """Group GPUs by model and estimated demand (the automatic mode).

    Largest estimates first (then by tenant). Each tenant gets a group of whole
    GPUs of its model, taken best fit: the node whose free GPUs cover the rest of
    the estimate most tightly, else the node with the most free GPUs, repeatedly.
    ``permitted`` limits, per tenant, the nodes its group may take (a tenant not
    listed may take any). With ``shared``, the GPUs left over form one open group
    per model, ``shared-<model>``. Unhealthy GPUs are not assigned.
    """
    free: dict[str, list[Gpu]] = {n.name: [g for g in n.gpus if g.healthy] for n in nodes}
    groups: list[ResourceGroup] = []
    unmet: list[tuple[str, int]] = []
    for est in sorted(estimates, key=lambda e: (-e.gpus, e.tenant, e.model or "")):
        allowed = permitted.get(est.tenant) if permitted is not None else None
        taken = _take(free, est, allowed)
        name = est.tenant if est.model is None else f"{est.tenant}-{slug(est.model)}"
        models = frozenset() if est.model is None else frozenset({est.model})
        groups.append(ResourceGroup(name, gpus=frozenset(taken), tenants=frozenset({est.tenant}),
                                    models=models))
        if len(taken) < est.gpus:
            unmet.append((est.tenant, est.gpus - len(taken)))
    if shared:
        groups.extend(_shared_groups(free))
    names = [g.name for g in groups]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise InvalidInput(f"two estimates build the same group {dup}: give one per tenant "
                           "and model")
    return GroupPlan(tuple(groups), tuple(unmet))


def _take(free: dict[str, list[Gpu]], est: DemandEstimate, allowed: frozenset[str] | None
          ) -> list[str]:
    """Remove and return the uuids of up to ``est.gpus`` GPUs for ``est``, best fit."""
    taken: list[str] = []
    while len(taken) < est.gpus:
        pools = {name: [g for g in gpus if est.model is None or g.model == est.model]
                 for name, gpus in free.items() if allowed is None or name in allowed}
        pools = {name: gpus for name, gpus in pools.items() if gpus}
        if not pools:
            break
        need = est.gpus - len(taken)
        covering = [(len(g), name) for name, g in pools.items() if len(g) >= need]
        name = min(covering)[1] if covering else min(pools, key=lambda n: (-len(pools[n]), n))
        for gpu in pools[name][:need]:
            taken.append(gpu.uuid)
            free[name].remove(gpu)
    return taken


def _shared_groups(free: dict[str, list[Gpu]]) -> list[ResourceGroup]:
    by_model: dict[str, set[str]] = {}
    for gpus in free.values():
        for g in gpus:
            by_model.setdefault(g.model, set()).add(g.uuid)
    return [ResourceGroup(f"shared-{slug(model)}", gpus=frozenset(uuids),
                          models=frozenset({model}))
            for model, uuids in sorted(by_model.items())]
