"""Where a pod would fit, node by node, and why not elsewhere: the core's own answers.

Shared by the offline and the live ``gpupool inspect``: the candidates, scores and
allocations come from a core ``Placer``, the reasons from ``core.fit.explain``,
the class / group / quota refusal from ``core.eligibility.constraints_for``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpupool.core.allocation import Allocation
from gpupool.core.eligibility import Catalogue, constraints_for
from gpupool.core.fit import explain
from gpupool.core.placement import Placer, choose
from gpupool.core.reasons import Reason
from gpupool.core.request import PodRequest
from gpupool.core.state import ClusterState


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    """One node's answer: an allocation with its score, or the reason it does not fit."""

    node: str
    allocation: Allocation | None = None
    score: float | None = None
    reason: Reason | None = None
    chosen: bool = False


def verdicts(state: ClusterState, request: PodRequest, catalogue: Catalogue, placer: Placer,
             rng: random.Random) -> tuple[list[NodeVerdict], Reason | None]:
    """Every node's verdict (fits: score and GPUs; else the reason), and a pod-level block."""
    constraints = constraints_for(state, request, catalogue)
    cands = placer.candidates(state, request, constraints)
    fits: dict[int, NodeVerdict] = {}
    if cands.indices.size:
        scores = placer.score(state, request, cands, rng)
        best = choose(scores.value, rng)
        for k, i in enumerate(cands.indices.tolist()):
            fits[i] = NodeVerdict(state.nodes[i].name,
                                  placer.allocate_on(state, request, cands, scores, k),
                                  float(scores.value[k]), chosen=k == best)
    out = [fits.get(i) or NodeVerdict(n.name, reason=explain(state, request, i, constraints))
           for i, n in enumerate(state.nodes)]
    return out, constraints.blocked


def gpus_json(alloc: Allocation) -> list[dict[str, Any]]:
    return [{"index": s.gpu_position, "uuid": s.gpu_uuid, "memoryMiB": s.memory_mib,
             "corePct": s.core_pct, "container": s.container} for s in alloc.slices]


def ordered(found: Sequence[NodeVerdict]) -> list[NodeVerdict]:
    """Fitting nodes first, best score first; then the rest in cluster order."""
    fit = sorted((v for v in found if v.allocation is not None),
                 key=lambda v: (not v.chosen, -(v.score or 0.0)))
    return fit + [v for v in found if v.allocation is None]


def nodes_json(found: Sequence[NodeVerdict]) -> list[dict[str, Any]]:
    return [{"node": v.node, "fits": v.allocation is not None,
             "score": None if v.score is None else round(v.score, 6),
             "chosen": v.chosen,
             "gpus": gpus_json(v.allocation) if v.allocation is not None else [],
             "reason": v.reason.sentence() if v.reason is not None else None,
             "check": v.reason.check.value if v.reason is not None else None,
             "permanent": v.reason.permanent if v.reason is not None else None}
            for v in ordered(found)]


def slices_text(alloc: Allocation) -> str:
    """``#0 8192 MiB 30 % (main), ...`` (a table cell)."""
    return ", ".join(f"#{s.gpu_position} {s.memory_mib} MiB {s.core_pct} %"
                     + (f" ({s.container})" if s.container else "")
                     for s in alloc.slices) or "no GPU"
