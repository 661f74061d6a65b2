"""Configuration shared by the policy factories (weights come from here, not literals)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpupool.core.workload import TargetWorkload


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """What a policy may be tuned with. ``workload`` is FGD's target workload."""

    workload: TargetWorkload | None = None
    weights: dict[str, float] = field(default_factory=dict)

    def weight(self, name: str, default: float) -> float:
        return float(self.weights.get(name, default))
