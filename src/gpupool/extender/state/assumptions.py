"""Assumptions: the placements this replica handed to kube-scheduler's bind, counted as
taken until the bind comes.

kube-scheduler runs one scheduling cycle at a time and binds asynchronously, so the next
pods' filter and prioritize arrive while earlier pods' binds are still on their way.
kube-scheduler assumes a pod in its own cache the moment it picks the pod's node; the
extender does the same with its GPUs: the placement it handed to bind — the one node
with prioritize's top score, or filter's only passing node (kube-scheduler does not
call prioritize then) — is held from that moment under the source ``assume``
(``holdings``), so the next pods are placed around it instead of onto it.

An assumption ends

* when the pod's bind comes (``bound`` if it names the assumed node, ``moved`` if
  kube-scheduler's own scores chose another): the bind decides again and holds its own
  allocation;
* ``expired``: ``expiry_s`` after it was made, if no bind came (the pod's cycle failed
  after prioritize, or the scheduler went away);
* ``yielded``: at once when a record of the cluster needs its room (a bound pod's
  decision, a GPULedger entry, possibly another replica's) or is the pod's own (another
  replica bound it): an assumption is this replica's expectation, never a claim on the
  cluster. It is never written anywhere, so another replica never sees it and is never
  held back by it;
* ``dropped``: the pod was deleted or finished, or a newer cycle of the same pod replaced
  it.

When the bind names the assumed node and nothing the placement rested on has changed
since (``Basis``: the same request, policy and GPU mask, the node's row untouched), the
bind takes the assumed allocation as it is instead of deciding again: deciding again
would give the very same allocation (a decision on one node reads only that node's row,
the request, the constraints and the policy). It is still reserved, checked against the
GPULedger and written by compare-and-swap like any other.

``Assumptions`` only keeps the records (node, expiry and basis per pod, oldest first);
the holdings themselves are ``Holdings``'.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI reads this module's defaults before anything heavy is loaded
    import numpy as np

    from gpupool.core.placement import Placer
    from gpupool.core.request import PodRequest

ASSUME = "assume"  # the holdings' source of an assumption
ASSUME_EXPIRY_S = 35.0
"""How long an assumption waits for its bind: a little above the longest kube-scheduler
waits for one call to the extender (``httpTimeout``, 30 s as shipped)."""
OUTCOMES = ("made", "bound", "moved", "expired", "yielded", "dropped")


@dataclass(frozen=True, slots=True)
class Basis:
    """What an assumed placement was decided from: the pod's request, the placer (its
    policy), the constraints' GPU mask (by identity: one object per class, group and
    catalogue epoch), the state's layout and the node's row version once the assumption
    was held."""

    request: PodRequest
    placer: Placer
    gpu_mask: np.ndarray | None
    layout: object
    version: int


@dataclass(frozen=True, slots=True)
class Assumption:
    node: str
    expires_s: float
    basis: Basis | None = None


class Assumptions:
    """Assumptions by pod UID in the order they expire (one expiry for all)."""

    def __init__(self, expiry_s: float = 0.0):
        self.expiry_s = expiry_s  # 0: off (nothing is assumed)
        self.by_key: OrderedDict[str, Assumption] = OrderedDict()
        self.count: Callable[[str], None] = lambda outcome: None  # metrics, when wired

    def add(self, key: str, node: str, now: float, basis: Basis | None = None) -> None:
        self.by_key.pop(key, None)
        self.by_key[key] = Assumption(node, now + self.expiry_s, basis)
        self.count("made")

    def basis_of(self, key: str) -> Basis | None:
        found = self.by_key.get(key)
        return found.basis if found is not None else None

    def node_of(self, key: str) -> str | None:
        found = self.by_key.get(key)
        return found.node if found is not None else None

    def forget(self, key: str, outcome: str) -> bool:
        """Drop ``key``'s record, counting how it ended; False if there was none."""
        if self.by_key.pop(key, None) is None:
            return False
        self.count(outcome)
        return True

    def due(self, now: float) -> list[str]:
        """The keys whose assumption has expired by ``now``, oldest first."""
        out = []
        for key, found in self.by_key.items():
            if found.expires_s > now:
                break
            out.append(key)
        return out

    def on_node(self, node: str) -> list[str]:
        return [key for key, found in self.by_key.items() if found.node == node]
