"""The target workload FGD-type policies measure fragmentation against, in the extender.

The derivation is the core's (``gpupool.core.policies.observed``), so the
simulator's ``--learn`` mode learns exactly as the extender does: the task
shape of every gpupool allocation the cache holds plus the pods recently seen
in filter calls, each pod once, the popular shapes covering 95 % of them; with
fewer than ``MIN_SAMPLES`` GPU pods the built-in ``BUILTIN_WORKLOAD``. The
extender re-derives it at start-up and every ``--workload-every`` seconds
(``Extender.refresh_policy``).
"""

from __future__ import annotations

from gpupool.core.policies.observed import (
    BUILTIN_WORKLOAD,
    MIN_SAMPLES,
    allocation_shape,
    observed_shapes,
    observed_workload,
)

__all__ = ["BUILTIN_WORKLOAD", "MIN_SAMPLES", "allocation_shape", "observed_shapes",
           "observed_workload"]
