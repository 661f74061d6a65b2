"""How large a request body the extender accepts, per verb, sized from the largest
legitimate request of the cluster it serves.

kube-scheduler's bodies are bounded by what the API server can hold and by the cluster's
size (``--max-nodes``, default 5,000: the largest cluster Kubernetes supports):

* a pod: at most ``POD_BYTES`` (etcd keeps objects up to 1.5 MiB; the scheduler sends
  the pod as stored);
* filter and prioritize: the pod plus every node — a name each (``nodeCacheCapable:
  true``, what gpupool ships: ``NAME_BYTES``, a 253-character DNS name with its quotes
  and comma) or a whole Node object each (``false``: ``NODE_BYTES``, a large node with
  its 50 image entries, labels, annotations and conditions);
* preempt: the pod plus, for each candidate node (kube-scheduler's defaults: a tenth of
  the nodes, at least 100), its proposed victims — a UID each (``MetaVictims``, up to
  ``PODS_PER_NODE``) or whole pods (up to ``VICTIM_PODS`` of ``VICTIM_POD_BYTES``);
* bind: four names (``BIND_BYTES``).

A larger body is refused with an ``Error`` naming the limit and the flag that raises it;
it is read and thrown away, never buffered. So is a preempt body naming more candidate
nodes than the cluster has (``nodes``: its cost grows with the nodes named, and a few
hundred thousand small entries fit in the byte limit). ``budget_bytes`` bounds the
bodies buffered at once over all connections, so concurrent large requests cannot add up
past the process's memory limit.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024
POD_BYTES = 2 * MIB
NAME_BYTES = 256
NODE_BYTES = 64 * 1024
PODS_PER_NODE = 256
VICTIM_BYTES = 64  # {"UID":"<36 characters>"},
VICTIM_PODS = 32
VICTIM_POD_BYTES = 16 * 1024
BIND_BYTES = 16 * 1024
MAX_NODES = 5000


def candidates(max_nodes: int) -> int:
    """Nodes kube-scheduler proposes for preemption at most, with its defaults
    (minCandidateNodesPercentage 10, minCandidateNodesAbsolute 100)."""
    return min(max_nodes, max(100, max_nodes // 10))


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """Largest body accepted per verb, and for all bodies being read at once."""

    filter_bytes: int
    preempt_bytes: int
    bind_bytes: int = BIND_BYTES
    budget_bytes: int = 0
    nodes: int = MAX_NODES  # the most nodes a call can name (a preempt's candidates)

    @classmethod
    def for_cluster(cls, max_nodes: int = MAX_NODES, cache_capable: bool = True
                    ) -> BodyLimits:
        per_node = NAME_BYTES if cache_capable else NODE_BYTES
        victims = PODS_PER_NODE * VICTIM_BYTES if cache_capable else \
            VICTIM_PODS * VICTIM_POD_BYTES
        filter_bytes = POD_BYTES + max_nodes * per_node
        preempt_bytes = POD_BYTES + candidates(max_nodes) * (NAME_BYTES + victims)
        return cls(filter_bytes, preempt_bytes, BIND_BYTES,
                   2 * max(filter_bytes, preempt_bytes), max_nodes)

    def of(self, verb: str) -> int:
        if verb == "bind":
            return self.bind_bytes
        return self.preempt_bytes if verb == "preempt" else self.filter_bytes

    def describe(self) -> str:
        return (f"filter/prioritize {self.filter_bytes / MIB:.1f} MiB, preempt "
                f"{self.preempt_bytes / MIB:.1f} MiB, bind {self.bind_bytes // 1024} KiB, "
                f"{self.budget_bytes / MIB:.0f} MiB at once")
