"""Spread (least-loaded): the node, and the GPU, with the most left after placing.

    score(n) = gpu_free'(n)/gpu_cap(n) + cpu_free'(n)/cpu_cap(n) + mem_free'(n)/mem_cap(n)
    GPU      = loosest first
"""

from __future__ import annotations

from gpupool.core.policies.config import PolicyConfig
from gpupool.core.policies.measure import remaining_share
from gpupool.core.scoring import GpuOrder, ScoreInput, Scores


class Spread:
    name = "spread"
    gpu_order = GpuOrder.LOOSEST

    def __init__(self, config: PolicyConfig):
        self.config = config

    def score(self, inp: ScoreInput) -> Scores:
        return Scores(remaining_share(inp))
