"""The narrow interface every placement policy implements, and its inputs."""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

import numpy as np
import numpy.typing as npt

from gpupool.core.request import GpuDemand, PodRequest
from gpupool.core.state import BoolArray, ClusterState, IntArray

FloatArray = npt.NDArray[np.float64]


class GpuOrder(Enum):
    """How a policy ranks the GPUs of the chosen node."""

    TIGHTEST = "tightest"  # least free share first (best fit)
    LOOSEST = "loosest"  # most free share first (least loaded)


@dataclass(frozen=True, slots=True)
class ScoreInput:
    """Per-decision data: thrown away after the decision."""

    state: ClusterState
    request: PodRequest
    demand: GpuDemand | None
    candidates: IntArray  # node indices that fit
    gpu_fit: BoolArray | None  # [node, gpu] can take one slice now
    rng: random.Random
    gpu_mask: BoolArray | None = None  # the class / group GPU mask behind gpu_fit (read-only;
    # one object per mask and cluster epoch, so caches may key on its identity)


@dataclass(frozen=True, slots=True)
class Scores:
    """Higher is better. ``gpu`` optionally fixes the GPU position per candidate."""

    value: FloatArray
    gpu: IntArray | None = None


class Policy(Protocol):
    """A placement policy: scores the feasible nodes of one request."""

    name: str
    gpu_order: GpuOrder

    def score(self, inp: ScoreInput) -> Scores: ...
