"""How much of each GPU model the workload's model-bound tasks need.

For each list of models S that shapes of the target workload accept (a task
with ``TaskShape.models``), their GPU demand is that list's part of the
workload's GPU demand, scaled to the cluster's GPU capacity C (at full load the
workload fills the cluster)::

    D_S = C · Σ_{t bound to S} w_t·k_t·m_t / Σ_t w_t·k_t·m_t

It is split over the models of S in proportion to their capacity K_m, and a
model's *reserved share* is what its GPUs are asked for by tasks that have no
other choice among the models they name::

    u_m = min(1, Σ_{S ∋ m} D_S · K_m / Σ_{m' ∈ S} K_m' / K_m)

0 for a model no bound shape names, and 0 everywhere for a workload without
model-bound shapes. FGD-balance charges a task u_m per milli-GPU it takes on a
node of model m, so tasks that can run anywhere leave the scarce models to the
tasks that can run only there.
"""

from __future__ import annotations

import numpy as np

from gpupool.core.scoring import FloatArray
from gpupool.core.state import ClusterState
from gpupool.core.workload import TargetWorkload


class ModelScarcity:
    """Reserved share per GPU model, per node of a cluster (kept per layout)."""

    def __init__(self, workload: TargetWorkload):
        pairs = list(zip(workload.shapes, workload.weights, strict=True))
        total = sum(w * s.gpu_count * s.gpu_milli for s, w in pairs)
        bound: dict[frozenset[str], float] = {}
        for s, w in pairs:
            if s.models is not None and total:
                bound[s.models] = bound.get(s.models, 0.0) + w * s.gpu_count * s.gpu_milli / total
        self.bound = bound  # model list -> its part of the workload's GPU demand
        self._held: tuple[object, int, FloatArray] | None = None

    def reserved(self, capacity: dict[str, int]) -> dict[str, float]:
        """u_m for each model of ``capacity`` (GPUs per model)."""
        everything = sum(capacity.values())
        asked = dict.fromkeys(capacity, 0.0)
        for models, part in self.bound.items():
            here = [m for m in sorted(models) if capacity.get(m, 0) > 0]
            among = sum(capacity[m] for m in here)
            for m in here:
                asked[m] += part * everything * capacity[m] / among
        return {m: min(1.0, asked[m] / k) if k else 0.0 for m, k in capacity.items()}

    def per_node(self, state: ClusterState) -> FloatArray:
        """u of each node's GPU model (zeros when no shape is model-bound)."""
        held = self._held
        if held is not None and held[0] is state.layout and held[1] == len(state.models):
            return held[2]
        if not self.bound or not state.models:
            values = np.zeros(len(state.nodes), np.float64)
        else:
            gpus = np.bincount(state.model_id, weights=state.present.sum(axis=1),
                               minlength=len(state.models))
            u = self.reserved({m: int(gpus[i]) for i, m in enumerate(state.models)})
            values = np.array([u[m] for m in state.models], np.float64)[state.model_id]
        self._held = (state.layout, len(state.models), values)
        return values
