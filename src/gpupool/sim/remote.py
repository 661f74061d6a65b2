"""Remote GPU slices in the simulator: where a pod runs when its slice is served elsewhere,
and what remote slices bought.

``--remote`` gives every GPU pod of the workload one ``gpupool.io/placement``:

* ``off``: ``local`` (every pod as without remote slices);
* ``on``: ``remote-allowed``;
* ``required``: ``remote-required``.

How a pod finds its node (the model, docs/simulator.md "Remote slices"): the trace does
not say where a pod lives, so the simulator does what kube-scheduler and gpupool's
extender would do. A pod goes where the policy puts it whole (the extender's prioritize
ranks the nodes that can hold the whole pod first), exactly as with ``off``. Only when no
node can hold it whole does it run elsewhere: its *home* is, among the nodes that can run
it with a slice served from another node, one of the best tier
(``ServingPlacer.homes``: a node whose topology domain has a GPU with room before one
that must reach any node), then the one kube-scheduler's ``NodeResourcesFit``
(``LeastAllocated``, CPU and memory weighted equally) scores highest, ties to node order;
``ServingPlacer.decide`` then places its slice tier by tier with the run's policy. With
``required`` every slice is served by a slice server, on the pod's own node when it was
placed whole there (the numbers are those of ``on``; only the data path differs).

``ServingTally`` records, per arrival, where the pod's slices went, so a run reports at
its headline point how many GPU pods ran, how many of their slices were served from
another node, how many ran on a node without GPUs, and the share served by the pod's own
node.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum

import numpy as np

from gpupool.core.allocation import Allocation
from gpupool.core.request import PodRequest, Serving
from gpupool.core.serving import Homes, ServingConfig
from gpupool.core.state import ClusterState


class RemoteMode(Enum):
    """``--remote``: the ``gpupool.io/placement`` every GPU pod of the run carries."""

    OFF = "off"
    ON = "on"
    REQUIRED = "required"

    @property
    def serving(self) -> Serving:
        return {RemoteMode.OFF: Serving.LOCAL, RemoteMode.ON: Serving.REMOTE_ALLOWED,
                RemoteMode.REQUIRED: Serving.REMOTE_REQUIRED}[self]

    def config(self, domains: tuple[str, ...]) -> ServingConfig:
        """The cluster's serving configuration: remote slices enabled unless ``off``."""
        return ServingConfig(self is not RemoteMode.OFF, domains)

    def asked(self, request: PodRequest) -> PodRequest:
        """``request`` with this mode's placement (a pod without GPUs as it is)."""
        if self is RemoteMode.OFF or not request.gpus:
            return request
        return replace(request, serving=self.serving)


def choose_home(state: ClusterState, request: PodRequest, homes: Homes) -> int | None:
    """The node a pod that fits nowhere whole runs on: the best tier, then kube-scheduler's
    ``LeastAllocated`` score of CPU and memory after the pod, then node order (None: no
    node can run it)."""
    rows = np.flatnonzero(homes.rank >= 0)
    if rows.size == 0:
        return None
    rows = rows[homes.rank[rows] == homes.rank[rows].min()]
    cpu = (state.cpu_free[rows] - request.cpu_milli) / np.maximum(state.cpu_cap[rows], 1)
    mem = (state.mem_free[rows] - request.memory_mib) / np.maximum(state.mem_cap[rows], 1)
    return int(rows[int(np.argmax(cpu + mem))])


NOT_PLACED = -1
NO_GPU = -2


@dataclass(frozen=True, slots=True)
class SliceCounts:
    """Where GPU pods' slices were served, counted at one point of a run."""

    gpu_pods_placed: int = 0
    remote_slices: int = 0  # served from another node than the pod's
    gpu_pods_on_gpuless_nodes: int = 0
    local_slices_pct: float = 100.0  # % of GPU pods' slices served by their own node
    by_tier: dict[str, int] = field(default_factory=dict)  # own node, each label, any node


class ServingTally:
    """Where each arrival's slices went: its tier rank (0: its own node), ``NO_GPU`` for a
    pod without GPUs, ``NOT_PLACED``; and whether its node has GPUs at all."""

    def __init__(self, state: ClusterState, arrivals: int, labels: tuple[str, ...]):
        self.labels = labels
        self.tier = np.full(arrivals, NOT_PLACED, np.int64)
        self.gpuless_home = np.zeros(arrivals, np.bool_)
        self._has_gpus = {n.name: bool(n.gpus) for n in state.nodes}

    def record(self, index: int, request: PodRequest, alloc: Allocation, rank: int) -> None:
        if not request.gpus:
            self.tier[index] = NO_GPU
            return
        self.tier[index] = rank
        self.gpuless_home[index] = not self._has_gpus[alloc.node]

    def counts(self, upto: int) -> SliceCounts:
        """What the first ``upto`` arrivals got."""
        tier = self.tier[:upto]
        placed = tier >= 0
        gpu_pods = int(placed.sum())
        remote = int((tier > 0).sum())
        names = ("own node", *self.labels, "any node")
        return SliceCounts(
            gpu_pods, remote, int((self.gpuless_home[:upto] & placed).sum()),
            round(100.0 * (gpu_pods - remote) / gpu_pods, 4) if gpu_pods else 100.0,
            {name: int((tier == r).sum()) for r, name in enumerate(names)})

