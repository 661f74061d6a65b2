"""Building tenant resource groups automatically: from each tenant's
estimated demand (``DemandEstimate``: GPUs, optionally of one model) and the cluster's
healthy GPUs, ``build_groups`` carves one group per tenant and model, taking whole
nodes first, and reports the GPUs it could not find (``GroupPlan.unmet``). The groups
are ordinary ``groups.ResourceGroup`` values.

``plan_automatic`` is what the controller runs for ResourceGroups in automatic mode: it
keeps each group's members stable, tops them up best fit within the group's models, node
selector and its tenants' permissions, and reports GPUs that two groups claim where they
may not share (conflicts).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpupool.core.errors import InvalidInput
from gpupool.core.groups import ResourceGroup
from gpupool.core.model import Gpu, Node
from gpupool.core.selector import Selector


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


# -- automatic groups: members chosen and kept by the controller -------------------------------
@dataclass(frozen=True, slots=True)
class AutoGroup:
    """An automatic group's spec: its tenants, GPU models (none: any), estimated demand in
    GPUs or as a percentage of the GPUs it could take, node selector, and whether its GPUs
    may also belong to other shareable groups."""

    name: str
    tenants: frozenset[str] = frozenset()
    models: frozenset[str] = frozenset()
    gpus: int | None = None
    share_pct: int | None = None
    nodes: Selector | None = None
    shareable: bool = False

    def __post_init__(self) -> None:
        if (self.gpus is None) == (self.share_pct is None):
            raise InvalidInput(f"group {self.name}: give the demand in GPUs or as a share, "
                               "one of the two")
        if (self.gpus is not None and self.gpus < 1) or \
                (self.share_pct is not None and not 1 <= self.share_pct <= 100):
            raise InvalidInput(f"group {self.name}: demand must be >= 1 GPU or 1-100 percent")

    def may_take(self, node: Node, gpu: Gpu) -> bool:
        if not gpu.healthy or (self.models and gpu.model not in self.models):
            return False
        return self.nodes is None or self.nodes.matches(dict(node.labels))


@dataclass(frozen=True, slots=True)
class Claim:
    """GPUs a group holds (a manual group's members, or a planned automatic group's)."""

    group: str
    gpus: frozenset[str]
    shareable: bool = False


@dataclass(frozen=True, slots=True)
class AutoPlan:
    """Members per automatic group, GPUs short of each demand, and conflicts per group (a
    GPU two groups claim where they may not share: sentences)."""

    members: dict[str, frozenset[str]]
    unmet: dict[str, int]
    conflicts: dict[str, tuple[str, ...]]


Permitted = Callable[[str], "frozenset[str] | None"]


def plan_automatic(nodes: Sequence[Node], groups: Sequence[AutoGroup], fixed: Sequence[Claim],
                   current: Mapping[str, frozenset[str]], busy: frozenset[str],
                   permitted: Permitted) -> AutoPlan:
    """Members for each automatic group, by name: it keeps the current members it may
    still take (when over its demand, idle GPUs go first: a GPU holding running pods
    (``busy``) moves only when the demand shrinks below them), then adds GPUs best fit
    (``build_groups``) among those it may take — its models, its node selector, healthy,
    permitted to every one of its tenants (``permitted``: uuids, None for all), and not
    claimed by a group it may not share with. ``fixed``: manual groups' claims."""
    claims: list[Claim] = list(fixed)
    members: dict[str, frozenset[str]] = {}
    unmet: dict[str, int] = {}
    for g in sorted(groups, key=lambda g: g.name):
        pool = _pool(nodes, g, permitted)
        free = pool - _blocked_for(g, claims)
        target = g.gpus if g.gpus is not None else -(-(g.share_pct or 0) * len(pool) // 100)
        keep = sorted(current.get(g.name, frozenset()) & free, key=lambda u: (u not in busy, u))
        keep = keep[:target]
        taken = set(keep)
        if len(taken) < target:
            taken |= _best_fit(nodes, free - taken, target - len(taken), g.name)
        members[g.name] = frozenset(taken)
        if len(taken) < target:
            unmet[g.name] = target - len(taken)
        claims.append(Claim(g.name, frozenset(taken), g.shareable))
    return AutoPlan(members, unmet, conflicts(nodes, claims))


def _pool(nodes: Sequence[Node], g: AutoGroup, permitted: Permitted) -> frozenset[str]:
    pool = {gpu.uuid for n in nodes for gpu in n.gpus if g.may_take(n, gpu)}
    for tenant in sorted(g.tenants):
        allowed = permitted(tenant)
        if allowed is not None:
            pool &= allowed
    return frozenset(pool)


def _blocked_for(g: AutoGroup, claims: Sequence[Claim]) -> frozenset[str]:
    """GPUs ``g`` may not take: claimed by a group that does not share, or by any group
    when ``g`` itself does not share."""
    return frozenset(u for c in claims if c.group != g.name and not (c.shareable and g.shareable)
                     for u in c.gpus)


def _best_fit(nodes: Sequence[Node], free: frozenset[str], need: int, name: str
              ) -> frozenset[str]:
    offered = [Node(n.name, n.cpu_milli, n.memory_mib,
                    tuple(g for g in n.gpus if g.uuid in free), n.labels, n.numa_nodes)
               for n in nodes if any(g.uuid in free for g in n.gpus)]
    if not offered:
        return frozenset()
    plan = build_groups(offered, [DemandEstimate(name, need)], shared=False)
    return plan.groups[0].gpus


def conflicts(nodes: Sequence[Node], claims: Sequence[Claim]) -> dict[str, tuple[str, ...]]:
    """Per group, each GPU it shares with a group where the two may not share."""
    where = {g.uuid: n.name for n in nodes for g in n.gpus}
    holders: dict[str, list[Claim]] = {}
    for c in claims:
        for u in c.gpus:
            holders.setdefault(u, []).append(c)
    out: dict[str, list[str]] = {}
    for u, cs in sorted(holders.items()):
        for c in cs:
            for other in cs:
                if other.group != c.group and not (c.shareable and other.shareable):
                    out.setdefault(c.group, []).append(
                        f"GPU {u} on node {where.get(u, '?')} is also in group {other.group}")
    return {g: tuple(v) for g, v in sorted(out.items())}
