"""Where a pod's claims can be allocated, read as kube-scheduler's allocator reads them.

``DeviceMasks`` evaluates the claims' CEL selectors (``gpupool.core.deviceselectors``) on
every GPU of the DRA nodes: the device as its ResourceSlice publishes it (every attribute
and capacity), or, for a GPU no slice lists yet, as its node agent would publish it from
the GPUDevice (driver attributes ``model``, ``uuid``, ``index``, ``numaNode``, the label
attributes, capacity ``memory`` and ``cores``). One mask per distinct set of expressions
is kept until the layout or a slice changes; a selector that does not compile or errors
on a device matches nothing there (kube-scheduler fails the claim's allocation on it),
and is logged once per claim and expression.

``fitting`` then finds, per DRA node, how the claims would be satisfied there now:

* each request's first alternative (``firstAvailable`` order) whose devices —
  selected, of its ResourceClass, healthy, with room for the request's capacity, or
  whole when it asks none — are enough: ``count`` of them (``ExactCount``), or every
  selected device of the node, at least one (``All``);
* ``matchAttribute`` constraints: one value of the attribute that enough of each named
  request's devices share (devices without the attribute do not count);

and groups the nodes by that choice, each group a core ``PodRequest`` (the chosen
demands, ``All`` with the node's count) and GPU mask, for the policy to score.
Requests of different alternatives or selectors are scored as one merged demand over
the union of their devices (as containers of one pod are), which can leave out a node
where they only just fit; that node then gets no score, kube-scheduler still judges it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

from gpupool.contract import dra
from gpupool.core.classes import ClassCatalog
from gpupool.core.deviceselectors import CelDevice, DeviceSelectors
from gpupool.core.fit import gpu_fit_mask
from gpupool.core.model import CORE_UNITS_PER_GPU, Gpu
from gpupool.core.request import MAX_GPUS_PER_POD, PodRequest
from gpupool.core.state import BoolArray, ClusterState, IntArray
from gpupool.extender.dra.draasks import ClaimAsks, DeviceChoice, SameAttribute
from gpupool.extender.state.draclaims import DraClaims

log = logging.getLogger(__name__)
KEPT_MASKS = 256  # selector masks kept per layout
VARIANTS = 16 * (MAX_GPUS_PER_POD + 1)  # (alternative, count) codes of one request
LOGGED_KEPT = 4096  # (claim, expression) pairs remembered as logged


def device_of_gpu(gpu: Gpu, memory_unit_mib: int) -> CelDevice:
    """A GPU no slice lists, as its node agent publishes it (see docs/dra.md)."""
    attrs: list[tuple[str, str, int | bool | str]] = [
        (dra.DRIVER, "model", gpu.model), (dra.DRIVER, "uuid", gpu.uuid),
        (dra.DRIVER, "index", gpu.index), (dra.DRIVER, "numaNode", gpu.numa_node)]
    for key, value in sorted(gpu.label_map().items()):  # gpupool.io/model, ... and its own
        where = dra.label_attribute(key)
        if where is not None and len(value) <= 64:
            attrs.append((*where, value))
    memory = gpu.memory_mib // memory_unit_mib * memory_unit_mib * 2**20
    caps = ((dra.DRIVER, dra.CAPACITY_CORES, Fraction(CORE_UNITS_PER_GPU)),
            (dra.DRIVER, dra.CAPACITY_MEMORY, Fraction(memory)))
    return CelDevice(dra.DRIVER, tuple(sorted(attrs, key=lambda a: a[:2])), caps, True)


class DeviceMasks:
    """Selector masks over the state's GPUs (use under the cache lock)."""

    def __init__(self) -> None:
        self.selectors = DeviceSelectors()
        self._stamp: tuple[object, int] | None = None
        self._grid: list[list[CelDevice]] = []
        self._masks: dict[tuple[str, ...], tuple[BoolArray, tuple[str, str] | None]] = {}
        self._values: dict[tuple[str, str], IntArray] = {}
        self._stable: dict[tuple[tuple[int, ...], int], BoolArray] = {}
        self._allowed: dict[tuple[tuple[str, ...], int],
                            tuple[BoolArray | None, BoolArray | None, BoolArray]] = {}
        self._logged: set[tuple[str, str]] = set()
        self.problems: dict[str, str] = {}  # claim -> its last selector problem (bounded)

    def refresh(self, state: ClusterState, claims: DraClaims, dra_rows: BoolArray) -> None:
        """Read the devices again when the layout or a slice changed."""
        stamp = (state.layout, claims.devices_version)
        if self._stamp is not None and self._stamp[0] is stamp[0] and self._stamp[1] == stamp[1]:
            return
        published = {k: d for devices in claims.selectable.values() for k, d in devices.items()}
        unit = state.memory_unit_mib
        self._grid = [[published.get((node.name, g.uuid)) or device_of_gpu(g, unit)
                       for g in node.gpus] if dra_rows[i] else []
                      for i, node in enumerate(state.nodes)]
        self._masks, self._values, self._allowed, self._stamp = {}, {}, {}, stamp
        self._stable = {}

    def mask(self, state: ClusterState, claims: DraClaims, dra_rows: BoolArray,
             expressions: tuple[str, ...], claim: str) -> BoolArray:
        """[node, gpu] -> the DRA node's GPU matches every expression (read-only)."""
        self.refresh(state, claims, dra_rows)
        found = self._masks.get(expressions)
        if found is None:
            found = self._evaluate(state, expressions)
            if len(self._masks) >= KEPT_MASKS:
                self._masks.clear()
            self._masks[expressions] = found
        mask, problem = found
        if problem is not None:
            self._report(claim, *problem)
        return mask

    def allowed(self, state: ClusterState, claims: DraClaims, dra_rows: BoolArray,
                expressions: tuple[str, ...], cls: BoolArray | None, claim: str
                ) -> BoolArray:
        """[node, gpu] -> a present GPU of a DRA node, selected, of the class ``cls``: the
        same object while nothing it depends on changes (the policies' caches key on it)."""
        selected = self.mask(state, claims, dra_rows, expressions, claim) if expressions \
            else None
        key = (expressions, id(cls))
        found = self._allowed.get(key)
        if found is not None and found[0] is cls and found[1] is selected:
            return found[2]
        out = state.present & dra_rows[:, None]
        if selected is not None:
            out &= selected
        if cls is not None:
            out &= cls
        out.flags.writeable = False
        if len(self._allowed) >= KEPT_MASKS:
            self._allowed.clear()
        self._allowed[key] = (cls, selected, out)
        return out

    def stable(self, mask: BoolArray) -> BoolArray:
        """An array equal to ``mask``: the one returned before when the content is the same
        (so the policies' caches, keyed on a mask's identity, keep hitting)."""
        key = (mask.shape, hash(mask.tobytes()))
        found = self._stable.get(key)
        if found is not None and np.array_equal(found, mask):
            return found
        if len(self._stable) >= KEPT_MASKS:
            self._stable.clear()
        mask.flags.writeable = False
        self._stable[key] = mask
        return mask

    def _evaluate(self, state: ClusterState, expressions: tuple[str, ...]
                  ) -> tuple[BoolArray, tuple[str, str] | None]:
        mask = np.zeros((len(state.nodes), state.width), np.bool_)
        problem: tuple[str, str] | None = None
        for i, row in enumerate(self._grid):
            for p, device in enumerate(row):
                for expression in expressions:
                    verdict = self.selectors.verdict(expression, device)
                    if not verdict.matches:
                        if verdict.error and problem is None:
                            problem = (expression, verdict.error)
                        break
                else:
                    mask[i, p] = True
        mask.flags.writeable = False
        return mask, problem

    def _report(self, claim: str, expression: str, error: str) -> None:
        sentence = (f"ResourceClaim {claim}: selector {expression[:120]!r}: {error}; the "
                    "devices where it fails do not match (kube-scheduler cannot allocate "
                    "them to it either)")
        if len(self.problems) >= LOGGED_KEPT:
            self.problems.clear()
        self.problems[claim] = sentence
        if (claim, expression) not in self._logged:
            if len(self._logged) >= LOGGED_KEPT:
                self._logged.clear()
            self._logged.add((claim, expression))
            log.warning("%s", sentence)

    def values(self, state: ClusterState, domain: str, name: str) -> IntArray:
        """[node, gpu] -> an id of the attribute's value on that DRA GPU (-1: none)."""
        found = self._values.get((domain, name))
        if found is None:
            ids: dict[object, int] = {}
            found = np.full((len(state.nodes), state.width), -1, np.int64)
            for i, row in enumerate(self._grid):
                for p, device in enumerate(row):
                    value = _attribute(device, domain, name)
                    if value is not None:
                        found[i, p] = ids.setdefault((type(value), value), len(ids))
            self._values[(domain, name)] = found
        return found


def _attribute(device: CelDevice, domain: str, name: str) -> object | None:
    for d, n, value in device.attributes:
        if d == domain and n == name:
            return value
    return None


@dataclass(frozen=True, slots=True)
class Group:
    """Nodes where the claims would be satisfied the same way: one request to score."""

    request: PodRequest
    nodes: BoolArray  # [node]
    gpus: BoolArray  # [node, gpu]: the devices the chosen alternatives may take (any node)


@dataclass(slots=True)
class _Chosen:
    """Per node, the alternative a request takes there (-1: none fits) and its count."""

    choice: IntArray
    count: IntArray
    allowed: list[BoolArray]  # per alternative: [node, gpu] selected and of its class
    fit: list[BoolArray]  # per alternative: [node, gpu] selected with room now
    narrow: BoolArray | None = None  # [node, gpu] a constraint's value (None: no narrowing)


def fitting(state: ClusterState, asks: ClaimAsks, base: PodRequest, masks: DeviceMasks,
            claims: DraClaims, classes: ClassCatalog, dra_rows: BoolArray) -> list[Group]:
    """The groups of DRA nodes where the claims fit now (none: they fit nowhere)."""
    masks.refresh(state, claims, dra_rows)
    chosen = [_choose(state, r.choices, r.claim, masks, claims, classes, dra_rows)
              for r in asks.requests]
    ok = dra_rows.copy()
    for c in chosen:
        ok &= c.choice >= 0
    names = [r.name for r in asks.requests]
    for constraint in asks.constraints:
        ok &= _constrain(state, constraint, names, chosen, masks)
    return _groups(asks, base, chosen, ok, masks.stable)


def _choose(state: ClusterState, choices: tuple[DeviceChoice, ...], claim: str,
            masks: DeviceMasks, claims: DraClaims, classes: ClassCatalog,
            dra_rows: BoolArray) -> _Chosen:
    n = len(state.nodes)
    out = _Chosen(np.full(n, -1, np.int64), np.zeros(n, np.int64), [], [])
    for k, choice in enumerate(choices):
        cls = classes.request_mask(state, choice.gpu_class, None) if choice.gpu_class else None
        allowed = masks.allowed(state, claims, dra_rows, choice.selectors, cls, claim)
        fit = gpu_fit_mask(state, choice.demand, allowed)
        if choice.all_devices:
            count = (allowed & state.healthy).sum(axis=1)
            good = (count > 0) & (count <= MAX_GPUS_PER_POD) & (fit.sum(axis=1) == count)
        else:
            count = np.full(n, choice.demand.count, np.int64)
            good = fit.sum(axis=1) >= count
        take = good & (out.choice < 0)
        out.choice[take] = k
        out.count[take] = count[take]
        out.allowed.append(allowed)
        out.fit.append(fit)
    return out


def _taken(c: _Chosen, grid: list[BoolArray]) -> BoolArray:
    """[node, gpu]: ``grid`` of the alternative chosen on each node."""
    out = np.zeros_like(grid[0]) if grid else np.zeros((0, 0), np.bool_)
    for k, g in enumerate(grid):
        rows = c.choice == k
        out[rows] = g[rows]
    return out


def _constrain(state: ClusterState, constraint: SameAttribute, names: list[str],
               chosen: list[_Chosen], masks: DeviceMasks) -> BoolArray:
    """[node] -> one value of the attribute serves every named request; narrows each
    named request's devices to that value (the first, in order of appearance)."""
    ids = masks.values(state, constraint.domain, constraint.name)
    members = [chosen[i] for i, name in enumerate(names) if name in constraint.requests]
    n = len(state.nodes)
    pick = np.full(n, -1, np.int64)
    taken = [_taken(c, c.fit) for c in members]
    together = np.zeros((n, ids.shape[1] if ids.ndim == 2 else 0), np.bool_)
    for t in taken:
        together |= t
    total = sum((c.count for c in members), np.zeros(n, np.int64))
    for v in np.unique(ids[ids >= 0]).tolist():
        same = ids == v
        good = (pick < 0) & ((together & same).sum(axis=1) >= total)  # distinct devices
        for c, t in zip(members, taken, strict=True):
            good &= (t & same).sum(axis=1) >= c.count
        pick[good] = v
    narrow = (ids == pick[:, None]) & (pick[:, None] >= 0)
    for c in members:
        c.narrow = narrow if c.narrow is None else c.narrow & narrow
    ok: BoolArray = pick >= 0
    return ok


def _groups(asks: ClaimAsks, base: PodRequest, chosen: list[_Chosen], ok: BoolArray,
            stable: Callable[[BoolArray], BoolArray]) -> list[Group]:
    rows = np.flatnonzero(ok)
    if rows.size == 0 or not chosen:
        return []
    if len(chosen) <= 6:  # (alternative, count) of every request as one int64
        code = np.zeros(rows.size, np.int64)
        for c in chosen:
            code = code * VARIANTS + c.choice[rows] * (MAX_GPUS_PER_POD + 1) + c.count[rows]
        variants, which = np.unique(code, return_inverse=True)
    else:
        keys = np.stack([a for c in chosen for a in (c.choice[rows], c.count[rows])], axis=1)
        variants, which = np.unique(keys, axis=0, return_inverse=True)
    groups = []
    for g in range(len(variants)):
        nodes = np.zeros(ok.shape[0], np.bool_)
        nodes[rows[which.reshape(-1) == g]] = True
        first = int(np.flatnonzero(which.reshape(-1) == g)[0])
        row = int(rows[first])
        demands, masks = [], []
        for r, c in enumerate(chosen):
            k, count = int(c.choice[row]), int(c.count[row])
            demands.append(replace(asks.requests[r].choices[k].demand, count=count))
            masks.append(c.allowed[k] if c.narrow is None else c.allowed[k] & c.narrow)
        gpus = masks[0]
        for m in masks[1:]:
            gpus = gpus | m
        if len(masks) > 1 or chosen[0].narrow is not None:
            gpus = stable(gpus)
        groups.append(Group(replace(base, gpus=tuple(demands), gpu_class=None), nodes, gpus))
    return groups
