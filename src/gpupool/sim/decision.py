"""One policy deciding for one run: the core ``Placer`` plus class constraints.

A pod that names a resource class (``class``) or a GPU selector may only use
the GPUs they match; the masks come from ``gpupool.core.eligibility.class_mask``
(cached per cluster layout). Tenant groups and quotas are not simulated.

With ``nodes_to_score`` below 100 a pod is decided among the nodes of
kube-scheduler's window only (``gpupool.sim.window``), as the extender would see
them; a pod placed only after its first window was refused is counted in
``bounced``. With ``learn_every`` the policy learns its target workload from the
arrivals (``gpupool.sim.learning``) instead of being handed ``config``'s. With ``remote``
on, a GPU pod that allows remote slices (``PodRequest.serving``, set by
``RemoteMode.asked``) and fits nowhere whole gets a home and a slice served from another
node (``gpupool.sim.remote``); ``last_tier`` says which tier served the last pod.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from gpupool.core.allocation import Allocation
from gpupool.core.classes import ClassCatalog, ResourceClass
from gpupool.core.eligibility import class_mask
from gpupool.core.fit import NO_CONSTRAINTS, Constraints
from gpupool.core.placement import Placer
from gpupool.core.policies import make_policy
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.request import PodRequest
from gpupool.core.serving import ZONE_LABEL, ServingPlacer
from gpupool.core.state import ClusterState, IntArray
from gpupool.sim.learning import Learner
from gpupool.sim.remote import RemoteMode, choose_home
from gpupool.sim.window import ALL_NODES, NodeWindow


def policy_seed(seed: int) -> int:
    """Seed of the policy's own generator (ties, random choices), apart from the order's."""
    return seed * 1_000_003 + 7


class Decider:
    """Decides placements on ``state`` with one named policy and a seeded generator."""

    def __init__(self, state: ClusterState, policy: str, config: PolicyConfig, seed: int,
                 classes: Iterable[ResourceClass] = (), nodes_to_score: int = ALL_NODES,
                 learn_every: float | None = None, remote: RemoteMode = RemoteMode.OFF,
                 domains: tuple[str, ...] = (ZONE_LABEL,)):
        self.state = state
        self.policy = policy
        self.window = NodeWindow(len(state.nodes), nodes_to_score)
        self.bounced = 0
        self.learner = None if learn_every is None else Learner(learn_every, config.weights)
        start = config if self.learner is None else self.learner.start()
        self.placer = Placer(make_policy(policy, start))
        self.serving = ServingPlacer(self.placer, remote.config(domains))
        self.last_tier = 0
        self.rng = random.Random(policy_seed(seed))
        self.catalog = ClassCatalog(classes)

    def decide(self, request: PodRequest, now: float = 0.0) -> Allocation | None:
        """The allocation the policy picks, or None when no node fits (never explained);
        ``now`` is the run's clock, which paces learning."""
        if self.learner is not None:
            learned = self.learner.arrived(request, now, self.state)
            if learned is not None:
                self.placer = Placer(make_policy(self.policy, learned))
                self.serving = ServingPlacer(self.placer, self.serving.config)
        constraints = self.constraints(request)
        self.last_tier = 0
        allocation = self._whole(request, constraints)
        if allocation is not None:
            return self.serving.as_asked(allocation, request)
        return self._served_elsewhere(request, constraints)

    def _whole(self, request: PodRequest, constraints: Constraints) -> Allocation | None:
        """The pod on one node, GPUs included (kube-scheduler's windows when modelled)."""
        if self.window.whole:
            return self._decide(request, constraints, None)
        for attempt, among in enumerate(self.window.rounds()):
            allocation = self._decide(request, constraints, among)
            if allocation is not None:
                self.bounced += attempt > 0
                return allocation
        return None

    def _served_elsewhere(self, request: PodRequest, constraints: Constraints
                          ) -> Allocation | None:
        """A pod that fits nowhere whole: a home, and its slice from another node."""
        if not self.serving.remote_for(request):
            return None
        homes = self.serving.homes(self.state, request, constraints)
        home = choose_home(self.state, request, homes)
        if home is None:
            return None
        served = self.serving.decide(self.state, request, self.state.nodes[home].name,
                                     self.rng, constraints)
        self.last_tier = served.tier.rank if served.tier is not None else 0
        return served.allocation

    def _decide(self, request: PodRequest, constraints: Constraints, among: IntArray | None
                ) -> Allocation | None:
        return self.placer.decide(self.state, request, self.rng, constraints, among,
                                  explain_limit=0).allocation

    def constraints(self, request: PodRequest) -> Constraints:
        if request.gpu_class is None and request.selector is None:
            return NO_CONSTRAINTS
        mask, refusal = class_mask(self.state, request, self.catalog)
        return Constraints(gpu_mask=mask, blocked=refusal)
