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
    summary: str = ""
    """The message without the figures only this node has ("": it has none)."""

    def sentence(self) -> str:
        return f"node {self.node}: {self.message}"

    def common(self) -> str:
        """The message as every node in the same situation gives it: no node name, none of
        the node's own free amounts. kube-scheduler counts identical reasons ("0/5000
        nodes are available: 1211 <reason>, ...") and cuts that message at 1,024 bytes,
        so reasons that differ from node to node would show a handful of nodes and no
        counts."""
        return self.summary or self.message
