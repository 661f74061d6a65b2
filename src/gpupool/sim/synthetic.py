"""The built-in synthetic cluster and workload, drawn from published trace figures.

Everything here comes from the statistics of the Alibaba GPU trace
(cluster-trace-gpu-v2023, ``openb``; Weng et al., USENIX ATC 2023) as tabled in
docs/simulator.md; no trace row is copied.

* **Cluster**: the 1,213 GPU nodes' mix of node types (GPU model, GPUs, cores,
  memory), scaled to ``nodes`` by largest remainder. The per-model columns of
  the published table are paired into node types by their counts (they match
  one to one, and reproduce the published CPU-per-GPU ratios).
* **Workload**: ``round(8152 × nodes / 1213)`` pods. GPU request class by the
  published shares (CPU-only, GPU-sharing, 1, 2, 4, 8 GPUs); the share of a
  GPU-sharing pod from the 15 most common ``gpu_milli`` values, weighted by their
  pod counts; CPU and memory per pod from a short ladder of sizes whose minimum,
  median and maximum are the published ones and whose weights are chosen so the
  mean is within 0.5 % of the published mean (a ladder, not a continuum: the
  trace has only 91 distinct shapes, and FGD's target workload is built from
  the popular shapes). The marginals are drawn independently (the published
  figures give no joint distribution).
* **Times** (for ``--mode timed``): lifetimes are exponential with the trace's
  median lifetime of 540 s; arrivals form a Poisson process spread over
  ``ARRIVAL_WINDOW_LIFETIMES`` mean lifetimes. The pods' total demand is about
  97 % of capacity, so by the last arrival live pods ask about 86 % of it
  (97 % × (1 − e^−0.25) / 0.25) — enough for fragmentation to turn pods away —
  and then the cluster drains. (The literal trace times load its cluster far
  less.)
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from gpupool.core.model import Node, uniform_node
from gpupool.core.request import GpuDemand, Mode, PodRequest
from gpupool.sim.scenario import Scenario, TracePod
from gpupool.sim.trace import GPU_MEMORY_MIB

GIB = 1024
TRACE_NODES = 1213
TRACE_PODS = 8152
DEFAULT_NODES = 200
WORKLOAD_SEED = 2023
"""The synthetic workload is one fixed draw; run seeds shuffle and resample it."""
ARRIVAL_WINDOW_LIFETIMES = 0.25
MEDIAN_LIFETIME_S = 540.0


@dataclass(frozen=True, slots=True)
class NodeType:
    model: str
    gpus: int
    cores: int
    memory_gib: int
    count: int  # nodes of this type among the trace's 1,213 GPU nodes


NODE_TYPES: tuple[NodeType, ...] = (
    NodeType("G2", 8, 96, 384, 549),
    NodeType("T4", 2, 104, 512, 387),
    NodeType("T4", 4, 96, 384, 17),
    NodeType("G3", 8, 128, 768, 39),
    NodeType("P100", 2, 16, 120, 107),
    NodeType("P100", 2, 64, 256, 22),
    NodeType("P100", 2, 8, 60, 2),
    NodeType("P100", 1, 8, 60, 3),
    NodeType("V100M32", 8, 96, 768, 21),
    NodeType("V100M32", 4, 48, 368, 9),
    NodeType("V100M16", 4, 32, 128, 28),
    NodeType("V100M16", 1, 8, 32, 19),
    NodeType("V100M16", 8, 64, 256, 7),
    NodeType("V100M16", 8, 82, 336, 1),
    NodeType("A10", 1, 128, 1024, 2),
)

GPU_CLASSES: tuple[tuple[str, int, int], ...] = (
    # (class, GPUs, pods of 8,152)
    ("cpu-only", 0, 1088),
    ("gpu-share", 1, 3078),
    ("one-gpu", 1, 3911),
    ("two-gpu", 2, 16),
    ("four-gpu", 4, 15),
    ("eight-gpu", 8, 44),
)

SHARE_MILLI: tuple[tuple[int, int], ...] = (
    # gpu_milli of a GPU-sharing pod: pods (the 15 most common of 20 values)
    (810, 1078), (470, 750), (320, 328), (650, 253), (230, 140), (460, 128), (590, 75),
    (160, 74), (550, 72), (220, 62), (370, 47), (110, 24), (480, 19), (50, 7), (330, 7),
)

CPU_MILLI_LADDER: tuple[tuple[int, float], ...] = (
    # published: min 1,000, median 11,300, mean 10,480, max 120,200 (this ladder: mean 10,508)
    (1000, 0.11), (4000, 0.15), (8000, 0.19), (11300, 0.30), (16000, 0.20), (32000, 0.049),
    (120200, 0.001),
)
MEMORY_MIB_LADDER: tuple[tuple[int, float], ...] = (
    # published: min 0, median 41,560, mean 37,236, max 737,280 (this ladder: mean 37,355)
    (0, 0.05), (8192, 0.10), (16384, 0.15), (32768, 0.179), (41560, 0.33), (65536, 0.17),
    (131072, 0.02), (737280, 0.001),
)


def draw(ladder: Sequence[tuple[int, float]], rng: random.Random) -> int:
    """One value of a ladder, with its weight as probability."""
    return rng.choices([v for v, _ in ladder], weights=[w for _, w in ladder])[0]


def ladder_mean(ladder: Sequence[tuple[int, float]]) -> float:
    return sum(v * w for v, w in ladder) / sum(w for _, w in ladder)


def apportion(total: int, weights: Sequence[int]) -> list[int]:
    """Split ``total`` in proportion to ``weights`` by largest remainder."""
    whole = sum(weights)
    exact = [total * w / whole for w in weights]
    counts = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda k: (counts[k] - exact[k], k))
    for k in order[: total - sum(counts)]:
        counts[k] += 1
    return counts


def synthetic_nodes(nodes: int = DEFAULT_NODES) -> list[Node]:
    """The trace's node-type mix scaled to ``nodes`` nodes."""
    out: list[Node] = []
    for kind, count in zip(NODE_TYPES, apportion(nodes, [t.count for t in NODE_TYPES]),
                           strict=True):
        for _ in range(count):
            out.append(uniform_node(f"syn-node-{len(out):04d}", kind.cores * 1000,
                                    kind.memory_gib * GIB, kind.gpus, kind.model,
                                    GPU_MEMORY_MIB[kind.model]))
    return out


def synthetic_request(k: int, rng: random.Random) -> PodRequest:
    """Pod ``k`` of the workload, drawn from the published marginals."""
    _, count, _ = rng.choices(GPU_CLASSES, weights=[c[2] for c in GPU_CLASSES])[0]
    is_share = count == 1 and rng.random() < GPU_CLASSES[1][2] / (
        GPU_CLASSES[1][2] + GPU_CLASSES[2][2])
    gpus: tuple[GpuDemand, ...] = ()
    if is_share:
        milli = rng.choices([m for m, _ in SHARE_MILLI], weights=[w for _, w in SHARE_MILLI])[0]
        gpus = (GpuDemand(1, memory_mib=0, core_pct=milli // 10, mode=Mode.SHARED),)
    elif count:
        gpus = (GpuDemand(count, mode=Mode.EXCLUSIVE),)
    cpu = draw(CPU_MILLI_LADDER, rng)
    memory = draw(MEMORY_MIB_LADDER, rng)
    return PodRequest(f"syn-pod-{k:05d}", cpu, memory, gpus)


def synthetic_scenario(nodes: int = DEFAULT_NODES, seed: int = WORKLOAD_SEED) -> Scenario:
    """Cluster and workload at ``nodes`` nodes, with arrival and departure times."""
    cluster = synthetic_nodes(nodes)
    rng = random.Random(seed)
    requests = [synthetic_request(k, rng) for k in range(round(TRACE_PODS * nodes / TRACE_NODES))]
    return Scenario(f"synthetic-{nodes}", tuple(cluster), tuple(timed(requests, rng)))


def timed(requests: list[PodRequest], rng: random.Random) -> list[TracePod]:
    """Poisson arrivals over ``ARRIVAL_WINDOW_LIFETIMES`` mean lifetimes, exponential lifetimes."""
    mean_life = MEDIAN_LIFETIME_S / math.log(2)
    rate = len(requests) / (ARRIVAL_WINDOW_LIFETIMES * mean_life)
    pods, now = [], 0.0
    for request in requests:
        now += rng.expovariate(rate)
        life = rng.expovariate(1.0 / mean_life)
        pods.append(TracePod(request, round(now, 3), round(now + life, 3)))
    return pods
