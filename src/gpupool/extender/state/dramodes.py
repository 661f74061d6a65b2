"""One node, one mode: which nodes serve their GPUs through DRA, as masks over the state.

A node serves its GPUs through Dynamic Resource Allocation when its v1 Node carries the
label ``gpupool.io/node-mode=dra`` or any of its GPUDevices does (``spec.labels``, which
the node agent sets in DRA mode). Either one is enough: the stricter reading keeps a
device-plugin pod off a node whose agent serves claims, even while the node label lags.

* A pod that asks gpupool's extended resources (the device-plugin path) may not go to a
  DRA node: ``NodeModes.constraints`` takes those nodes out of the constraints' node mask
  and names why (``Check.NODE_MODE``, permanent: waiting does not help).
* A pod whose GPUs come from ResourceClaims may only go to DRA nodes
  (``NodeModes.for_claims``): the scores of DRA pods are given to those nodes only.
* A ``remote-allowed`` pod counts its GPUs as the device plugin's ``gpupool.io/gpu`` of
  its own node, so it may run only on a device-plugin node with GPUs
  (``NodeModes.device_homes``), wherever its slice is served.

Masks are worked out once per cluster layout (a label change is a new layout) and the
combined node masks are kept per base mask, so the feasibility memo, which keys on the
masks' identity, keeps hitting.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from gpupool.contract.dra import MODE_DRA, NODE_MODE_LABEL
from gpupool.core.eligibility import Catalogue, class_mask, constraints_for
from gpupool.core.fit import Constraints
from gpupool.core.model import Node
from gpupool.core.request import PodRequest
from gpupool.core.state import BoolArray, ClusterState

DRA_NODE = (f"the node serves its GPUs through Dynamic Resource Allocation ({NODE_MODE_LABEL}="
            f"{MODE_DRA}): ask for them with a ResourceClaim, or run the pod on a "
            "device-plugin node")
COMBINED_KEPT = 16  # combined masks remembered per layout (one per group mask in use)


def is_dra_node(node: Node) -> bool:
    """The node or one of its GPUs says the node runs the DRA path."""
    if dict(node.labels).get(NODE_MODE_LABEL) == MODE_DRA:
        return True
    return any(dict(g.labels).get(NODE_MODE_LABEL) == MODE_DRA for g in node.gpus)


class NodeModes:
    """The DRA-node mask of the current layout and the node masks derived from it (use under
    the cache lock)."""

    def __init__(self) -> None:
        self._layout: object | None = None
        self._dra: BoolArray = np.zeros(0, np.bool_)
        self._homes: BoolArray = np.zeros(0, np.bool_)
        self._any = False
        self._combined: list[tuple[BoolArray | None, BoolArray]] = []

    def dra_mask(self, state: ClusterState) -> BoolArray:
        """[node] -> serves its GPUs through DRA."""
        if self._layout is not state.layout:
            self._dra = np.fromiter((is_dra_node(n) for n in state.nodes), np.bool_,
                                    len(state.nodes))
            self._any = bool(self._dra.any())
            self._homes = state.present.any(axis=1) & ~self._dra
            self._combined = []
            self._layout = state.layout
        return self._dra

    def device_homes(self, state: ClusterState) -> BoolArray:
        """[node] -> has GPUs, served through the device plugin (not DRA)."""
        self.dra_mask(state)
        return self._homes

    def dra_nodes(self, state: ClusterState) -> list[str]:
        return [state.nodes[int(i)].name for i in np.flatnonzero(self.dra_mask(state))]

    def constraints(self, state: ClusterState, request: PodRequest, catalogue: Catalogue
                    ) -> Constraints:
        """``constraints_for`` of a device-plugin pod, DRA nodes taken out (and named)."""
        c = constraints_for(state, request, catalogue)
        dra = self.dra_mask(state)
        if not self._any or not request.gpus or c.blocked is not None:
            return c
        return replace(c, node_mask=self._without_dra(c.node_mask, dra), excluded=dra,
                       excluded_why=DRA_NODE)

    def _without_dra(self, base: BoolArray | None, dra: BoolArray) -> BoolArray:
        for kept, combined in self._combined:
            if kept is base:
                return combined
        combined = ~dra if base is None else base & ~dra
        self._combined = [*self._combined[-(COMBINED_KEPT - 1):], (base, combined)]
        return combined

    def for_claims(self, state: ClusterState, request: PodRequest, catalogue: Catalogue
                   ) -> Constraints:
        """Where a pod's ResourceClaims may be allocated: DRA nodes, GPUs of the claims'
        class (no groups or quota: those are not applied to claims)."""
        gpu_mask, blocked = class_mask(state, request, catalogue.classes)
        if blocked is not None:
            return Constraints(blocked=blocked)
        return Constraints(node_mask=self.dra_mask(state), gpu_mask=gpu_mask)
