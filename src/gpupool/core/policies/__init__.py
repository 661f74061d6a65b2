"""Placement policies, one per module, each with its formula in its docstring.

``POLICIES`` maps a name to a factory taking a ``PolicyConfig``; the composition
root picks one at start-up (an unknown name fails there, never in the hot path).
"""

from __future__ import annotations

from collections.abc import Callable

from gpupool.core.errors import UnknownName
from gpupool.core.policies.bestfit import BestFit
from gpupool.core.policies.clustering import Clustering
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.policies.dotproduct import DotProduct
from gpupool.core.policies.fgd import Fgd
from gpupool.core.policies.fgdbalance import FgdBalance
from gpupool.core.policies.packing import Packing
from gpupool.core.policies.randomized import Randomized
from gpupool.core.policies.spread import Spread
from gpupool.core.scoring import Policy

POLICIES: dict[str, Callable[[PolicyConfig], Policy]] = {
    "random": Randomized,
    "best-fit": BestFit,
    "dot-product": DotProduct,
    "packing": Packing,
    "clustering": Clustering,
    "spread": Spread,
    "fgd": Fgd,
    "fgd-balance": FgdBalance,
}

DEFAULT_POLICY = "fgd-balance"
"""The policy the simulator measured best (docs/benchmarks.md)."""


def make_policy(name: str, config: PolicyConfig) -> Policy:
    """Build the named policy; unknown names fail with the list of known ones."""
    try:
        factory = POLICIES[name]
    except KeyError:
        known = ", ".join(sorted(POLICIES))
        raise UnknownName(f"unknown policy {name!r}; known policies: {known}") from None
    return factory(config)
