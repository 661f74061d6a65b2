"""kube-scheduler's node window: the extender only sees the nodes kube-scheduler found.

kube-scheduler does not run its filters on every node of a large cluster. It stops
once it has found ``numFeasibleNodesToFind`` nodes that pass its own plugins
(``percentageOfNodesToScore``; 0, the default, means adaptive: 50 − nodes/125 %, at
least 5 %, and never fewer than 100 nodes), starting where the previous pod's search
stopped, and calls the extender's filter with those nodes only. So at 5,000 nodes
gpupool chooses among about 500 of them, a different 500 for every pod.

A pod whose window holds no node with room is unschedulable for that scheduling
cycle even when other nodes have room: kube-scheduler puts it back in its queue and
tries again after a backoff (1 s, doubling up to 10 s), from where its search
stopped. The simulator has no clock in protocol mode, so it tries the next window at
once and counts the pod as **bounced** (one backoff or more in a real cluster); a pod
no window can hold fails as before.

In the simulator every node passes kube-scheduler's own plugins (the trace's CPU and
memory are gpupool's to check), so a search processes exactly one window of nodes.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from gpupool.core.errors import InvalidInput
from gpupool.core.state import IntArray

ADAPTIVE = 0  # percentageOfNodesToScore unset: kube-scheduler's adaptive share
ALL_NODES = 100
MIN_FEASIBLE_NODES = 100
MIN_FEASIBLE_PERCENTAGE = 5


def nodes_to_find(nodes: int, percentage: int) -> int:
    """How many nodes kube-scheduler hands the extender (``numFeasibleNodesToFind``)."""
    if not 0 <= percentage <= ALL_NODES:
        raise InvalidInput(f"percentageOfNodesToScore must be 0 (adaptive) to 100, "
                           f"not {percentage}")
    if nodes < MIN_FEASIBLE_NODES or percentage == ALL_NODES:
        return nodes
    share = percentage or max(MIN_FEASIBLE_PERCENTAGE, 50 - nodes // 125)
    return max(MIN_FEASIBLE_NODES, nodes * share // 100)


class NodeWindow:
    """The rotating window of node rows kube-scheduler offers the extender, pod by pod."""

    def __init__(self, nodes: int, percentage: int):
        self.nodes = nodes
        self.percentage = percentage
        self.size = nodes_to_find(nodes, percentage)
        self.start = 0

    @property
    def whole(self) -> bool:
        """Every node is offered every time: no window to model."""
        return self.size >= self.nodes

    def rounds(self) -> Iterator[IntArray]:
        """The windows one pod is offered until it is placed: the first from where the
        previous search stopped, then one per retry, until every node was offered once."""
        for _ in range(-(-self.nodes // self.size)):
            rows = np.arange(self.start, self.start + self.size, dtype=np.int64) % self.nodes
            self.start = (self.start + self.size) % self.nodes
            yield rows
