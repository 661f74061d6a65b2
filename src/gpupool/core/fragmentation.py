"""GPU fragmentation of nodes against a target workload (Weng et al., ATC 2023).

For node n and task shape t with per-GPU share ``m_t``, GPU count ``k_t`` and
CPU ``c_t``::

    F_n(t) = Σ_g free_g                         if t cannot run on n
                                                  (k_t = 0, CPU short, or fewer
                                                   than k_t GPUs with free_g ≥ m_t)
    F_n(t) = Σ_g free_g · [free_g < m_t]        otherwise

    F_n = Σ_t w_t · F_n(t)

i.e. the expected free GPU share a task drawn from the target workload cannot
use. ``free_g`` is the free share in milli-GPU (absent/unhealthy GPUs: -1,
counted as 0). Weights ``w_t`` are pod counts, so sums are exact integers.

A shape that accepts only some GPU models (``TaskShape.models``) cannot run on a
node of another model: there all of the node's free share is its fragment, as
in the FGD authors' harness (a "no access" fragment). The node's model enters
``measure`` as its *access class*: nodes whose models admit the same shapes
share a class (``access``); without model-bound shapes there is one class.

A model may also count *dead share* (``DeadShare``, off unless asked for; FGD
does not): free share on a GPU that is less than ``below``, the share only the
rarest sharing tasks fit in, weighted like ``weight`` tasks of the workload
that cannot use it::

    F'_n = F_n + weight · W · Σ_g free_g · [free_g < below]
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from gpupool.core.state import ClusterState, IntArray
from gpupool.core.workload import TargetWorkload

DENSE_ENTRIES = 1 << 18  # at most 2 MB of precomputed answers per GPU width (real workloads:
# ~2,000 entries; a workload of thousands of shapes with hundreds of shares searches)


@dataclass(frozen=True, slots=True)
class DeadShare:
    """Free share below ``below`` milli-GPU on a GPU counts ``weight`` times more."""

    below: int
    weight: float

    def measure(self, usable: IntArray, all_weight: int) -> IntArray:
        per_task = round(self.weight * all_weight)
        return np.asarray(np.where(usable < self.below, usable, 0).sum(axis=1) * per_task,
                          np.int64)


@dataclass(frozen=True, slots=True)
class _Runs:
    """Which shapes run, for nodes of one GPU width. A query names a share's block of
    ``width + 1`` GPU counts (``blocks`` holds each share's first) of an access class
    and a CPU rank: ``((class · shares + share) · (width + 1) + count) · ranks + rank``;
    its answer is the weight of the shapes of that share that the class admits and
    that need at most ``count`` GPUs and at most that much CPU. ``keys`` holds one
    entry per (block, shape) in that numbering, sorted, ``weights`` their running
    sum, ``before`` the running sum at each block's start; ``table`` the answer to
    every query, when that is small enough to keep."""

    ranks: int
    blocks: IntArray  # shares × 1: the first block of each share
    keys: IntArray
    weights: IntArray
    before: IntArray
    table: IntArray | None
    per_class: int = 0  # blocks per access class (shares × (width + 1))

    def answer(self, queries: IntArray) -> IntArray:
        if self.table is not None:
            return self.table.take(queries)
        found = np.searchsorted(self.keys, queries, side="right")
        return np.asarray(self.weights[found] - self.before[queries // self.ranks], np.int64)


class FragmentationModel:
    """Precomputed per-workload arrays; ``measure`` is vectorised over many nodes.

    How ``measure`` computes F: a task of shape t either runs on n or leaves all of
    n's free share as fragment, and it runs exactly when n has at least ``k_t`` GPUs
    with ``m_t`` free and ``c_t`` CPU. So, with ``W`` the sum of the weights,
    ``above_n(m)`` the free share on n's GPUs with at least m free and
    ``R_n(m)`` the weight of the shapes of share m that run on n::

        F_n = W · Σ_g free_g − Σ_m above_n(m) · R_n(m)

    ``R_n(m)`` depends on n only through how many GPUs have m free (at most ``GPUs
    per node + 1`` values) and the rank of n's free CPU among the shapes' CPU figures,
    so it is looked up (``_Runs``): a call costs a dozen array operations whatever the
    number of shapes. At one node 30-40 µs where a loop over the shares took 70-260
    µs; at 5,000 nodes 0.8x the loop's time for the built-in workload (4 shares) and
    0.12x for one of 1,700 shapes. Integer sums throughout: the figures are exact.
    """

    def __init__(self, workload: TargetWorkload, dense_entries: int = DENSE_ENTRIES,
                 dead: DeadShare | None = None):
        self.workload = workload
        self.dense_entries = dense_entries
        self.dead = dead
        groups: dict[int, list[tuple[int, int, int, int]]] = {}
        self._bound: list[frozenset[str]] = []  # the distinct model sets of model-bound shapes
        for shape, w in zip(workload.shapes, workload.weights, strict=True):
            if shape.gpu_count != 0:
                groups.setdefault(shape.gpu_milli, []).append(
                    (shape.gpu_count, shape.cpu_milli, w, self._bound_index(shape.models)))
        self._all_weight = int(sum(workload.weights))
        shares = sorted(groups)
        self._milli = np.array(shares, np.int64)[:, None, None]  # shares × 1 × 1
        self._shapes = [np.array(groups[m], np.int64).reshape(-1, 4) for m in shares]
        self._cpus = np.unique(np.concatenate([g[:, 1] for g in self._shapes])) \
            if shares else np.zeros(0, np.int64)  # the shapes' CPU figures, sorted
        self._runs: dict[int, _Runs] = {}
        self._signatures: dict[tuple[bool, ...], int] = {(True,) * len(self._bound): 0}
        self._access: tuple[object, int, IntArray] | None = None  # (layout, models seen, class)

    def _bound_index(self, models: frozenset[str] | None) -> int:
        """-1 for a shape that runs on any model, else its model set's index in ``_bound``."""
        if models is None:
            return -1
        if models not in self._bound:
            self._bound.append(models)
        return self._bound.index(models)

    @property
    def model_bound(self) -> bool:
        """Whether some shape accepts only some GPU models."""
        return bool(self._bound)

    def access(self, state: ClusterState) -> IntArray | None:
        """Each node's access class (None: one class, no shape is model-bound). Kept per
        layout; a new model seen after the tables were built adds a class."""
        if not self._bound:
            return None
        held = self._access
        if held is not None and held[0] is state.layout and held[1] == len(state.models):
            return held[2]
        per_model = np.array([self._class_of(m) for m in state.models], np.int64)
        classes = per_model[state.model_id] if per_model.size else np.zeros(0, np.int64)
        self._access = (state.layout, len(state.models), classes)
        return classes

    def _class_of(self, model: str) -> int:
        signature = tuple(model in models for models in self._bound)
        if signature not in self._signatures:
            self._signatures[signature] = len(self._signatures)
            self._runs.clear()  # the tables hold one block per class
        return self._signatures[signature]

    def _rank(self, cpu: IntArray) -> IntArray:
        """How many of the shapes' CPU figures ``cpu`` reaches (0: none)."""
        return np.searchsorted(self._cpus, cpu, side="right").astype(np.int64)

    def _runs_for(self, width: int) -> _Runs:
        runs = self._runs.get(width)
        if runs is not None:
            return runs
        ranks = self._cpus.size + 1
        shares = len(self._shapes)
        keys: list[IntArray] = []
        weights: list[IntArray] = []
        for signature, c in sorted(self._signatures.items(), key=lambda kv: kv[1]):
            allowed = np.array((True, *signature), np.bool_)  # index 0: shapes of any model
            for g, shapes in enumerate(self._shapes):
                counts, rank, ws = shapes[:, 0], self._rank(shapes[:, 1]), shapes[:, 2]
                admits = allowed[shapes[:, 3] + 1]
                for count in range(width + 1):
                    ok = (counts <= count) & admits
                    keys.append((((c * shares) + g) * (width + 1) + count) * ranks + rank[ok])
                    weights.append(ws[ok])
        key = np.concatenate(keys)
        order = np.argsort(key, kind="stable")
        key = key[order]
        total = np.concatenate(([0], np.cumsum(np.concatenate(weights)[order]))).astype(np.int64)
        size = len(self._signatures) * shares * (width + 1) * ranks
        before = total[np.searchsorted(key, np.arange(0, size, ranks), side="left")]
        blocks = np.arange(shares, dtype=np.int64)[:, None] * (width + 1)
        runs = _Runs(ranks, blocks, key, total, before, None, shares * (width + 1))
        if size <= self.dense_entries:
            runs = replace(runs, table=runs.answer(np.arange(size, dtype=np.int64)))
        self._runs[width] = runs
        return runs

    def measure(self, free: IntArray, cpu_free: IntArray,
                access: IntArray | None = None) -> IntArray:
        """Fragmentation (weighted milli-GPU) of each row of ``free`` [rows, gpus];
        ``access``: the rows' access classes (``access(state)[rows]``), when model-bound."""
        usable = np.maximum(free, 0)
        out = usable.sum(axis=1) * self._all_weight
        if self.dead is not None:
            out = out + self.dead.measure(usable, self._all_weight)
        if not self._shapes or not free.shape[0]:
            return np.asarray(out, np.int64)
        width = free.shape[1]
        runs = self._runs_for(width)
        fits = free >= self._milli  # shares × rows × gpus
        above = (fits * usable).sum(axis=2)  # shares × rows
        block = runs.blocks + np.count_nonzero(fits, axis=2)
        if access is not None:
            block = block + access * runs.per_class
        queries = block * runs.ranks + self._rank(cpu_free)
        return np.asarray(out - (above * runs.answer(queries)).sum(axis=0), np.int64)
