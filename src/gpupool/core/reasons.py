"""Why a pod does not fit a node, as values that render to actionable sentences."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Check(Enum):
    """The fit checks, in the order they are applied."""

    QUOTA = "quota"
    GROUP = "group"
    MODEL = "gpu-model"
    CLASS = "class"
    GPU_COUNT = "gpu-count"
    GPU_SIZE = "gpu-size"
    CPU = "cpu"
    MEMORY = "memory"
    GPU_HEALTH = "gpu-health"
    GPU_FREE = "gpu-free"


@dataclass(frozen=True, slots=True)
class Reason:
    """One failed check on one node.

    ``permanent`` separates "can never fit here" (capacity, model, class, group)
    from "does not fit now" (something else holds the room), as kube-scheduler's
    Unschedulable vs UnschedulableAndUnresolvable.
    """

    node: str
    check: Check
    message: str
    permanent: bool

    def sentence(self) -> str:
        return f"node {self.node}: {self.message}"
