"""What a pod's unallocated claims would be charged on each node: the worst case there.

kube-scheduler's allocator decides what a claim takes on the node it picks, after the
extender's filter has answered; what the claim then holds is charged to the tenant
(``draclaims``). So ``filter-claims`` must check quota against the most the claims
could take on each sent node:

* ``allocationMode: All``: every device of the node the request's selectors and class
  select (present, healthy or not), each with the request's capacity, or whole (its
  memory as gpupool accounts it: whole memory units) when it asks none;
* ``ExactCount``: ``count`` devices; whole ones count the largest ``count`` selectable
  devices of the node;
* ``firstAvailable``: per dimension, the largest of the sub-requests that could be
  allocated on the node (enough selected devices of its class, whatever their use now):
  the allocator takes the first that fits when it allocates, which the filter cannot know;
* each request is charged to its own ResourceClass (``<class>.gpupool.io``), and the
  tenant to the sum of all.

A request that cannot be allocated on a node in any way (its devices are not there, or
the node is not a DRA node, or not in the extender's inventory) is charged its least
nominal amount (each sub-request's ``count``, ``All`` as one device, whole GPUs at the
cluster's smallest selectable one): the DRA plugin refuses such a node anyway, and a
tenant over quota is still told so there.

The amounts are checked with the core's quota books (``QuotaBook.check`` and
``TenantBook.check``), the checks filter runs for device-plugin pods.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpupool.core.classes import ClassCatalog
from gpupool.core.eligibility import Catalogue
from gpupool.core.model import CORE_UNITS_PER_GPU
from gpupool.core.quota import Amount, Charge
from gpupool.core.reasons import Reason
from gpupool.core.request import GpuDemand
from gpupool.core.state import BoolArray, ClusterState, IntArray
from gpupool.extender.dra.draasks import ClaimAsks, DeviceChoice
from gpupool.extender.dra.draselect import DeviceMasks
from gpupool.extender.state.draclaims import DraClaims

Amounts = tuple[tuple[int, int, int], tuple[tuple[str, tuple[int, int, int]], ...]]


@dataclass(frozen=True, slots=True)
class NodeCharges:
    """Per node row, the worst-case amounts: ``total`` [node + 1, 3] (GPUs, MiB, % compute)
    and per ResourceClass; the last row is no node's (a name without inventory)."""

    total: IntArray
    by_class: dict[str, IntArray]

    def distinct(self, rows: IntArray) -> tuple[list[Amounts], IntArray]:
        """The distinct amounts of node ``rows`` (-1: a name without inventory) and, per
        row, which of them it has."""
        k = np.where(rows >= 0, rows, self.total.shape[0] - 1)
        names = sorted(self.by_class)
        table = np.hstack([self.total[k], *(self.by_class[c][k] for c in names)])
        rows_of, which = _unique_rows(table)
        out = [(_triple(r[:3]), tuple((c, _triple(r[3 + 3 * j:6 + 3 * j]))
                                      for j, c in enumerate(names))) for r in rows_of]
        return out, which


def _unique_rows(table: IntArray) -> tuple[IntArray, IntArray]:
    """``np.unique(table, axis=0, return_inverse=True)``, through a 1-D key (that sort is
    many times faster than the row-wise one); checked, and row-wise after a collision."""
    key = np.zeros(table.shape[0], np.uint64)
    with np.errstate(over="ignore"):
        for column in table.T:
            key = key * np.uint64(1_000_003) + column.astype(np.uint64)
    _, first, which = np.unique(key, return_index=True, return_inverse=True)
    rows_of = table[first]
    if not np.array_equal(rows_of[which.reshape(-1)], table):
        rows_of, which = np.unique(table, axis=0, return_inverse=True)
    return rows_of, which.reshape(-1)


def node_charges(state: ClusterState, asks: ClaimAsks, masks: DeviceMasks,
                 claims: DraClaims, classes: ClassCatalog, dra_rows: BoolArray
                 ) -> NodeCharges:
    """The worst-case amounts of ``asks`` on every node, plus one last row (no node)."""
    masks.refresh(state, claims, dra_rows)
    n = len(state.nodes)
    total = np.zeros((n + 1, 3), np.int64)
    by_class: dict[str, IntArray] = {}
    for request in asks.requests:
        worst = np.zeros((n + 1, 3), np.int64)
        floor = np.full((n + 1, 3), np.iinfo(np.int64).max, np.int64)
        per_class: dict[str | None, IntArray] = {}
        possible_any = np.zeros(n + 1, np.bool_)
        for choice in request.choices:
            cls = classes.request_mask(state, choice.gpu_class, None) if choice.gpu_class \
                else None
            allowed = masks.allowed(state, claims, dra_rows, choice.selectors, cls,
                                    request.claim)
            amounts, possible = _choice_amounts(state, choice, allowed)
            low = _nominal(state, choice, allowed)
            floor = np.minimum(floor, low)
            here = np.where(possible[:, None], amounts, 0)
            worst = np.maximum(worst, here)
            held = per_class.get(choice.gpu_class)
            per_class[choice.gpu_class] = here if held is None else np.maximum(held, here)
            possible_any |= possible
        worst[~possible_any] = floor[~possible_any]
        total += worst
        for cls_name, amounts in per_class.items():
            if cls_name is None:
                continue
            first = request.choices[0].gpu_class == cls_name
            amounts = amounts.copy()
            amounts[~possible_any] = floor[~possible_any] if first else 0
            held_sum = by_class.get(cls_name)
            by_class[cls_name] = amounts if held_sum is None else held_sum + amounts
    return NodeCharges(total, by_class)


def _choice_amounts(state: ClusterState, choice: DeviceChoice, allowed: BoolArray
                    ) -> tuple[IntArray, BoolArray]:
    """([node + 1, 3] amounts, [node + 1] could be allocated there) of one alternative."""
    unit = state.memory_unit_mib
    have = allowed.sum(axis=1)
    d = choice.demand
    if choice.all_devices:
        count, possible = have, have > 0
        whole = (state.unit_cap * allowed).sum(axis=1) * unit
    else:
        count = np.full(len(have), d.count, np.int64)
        possible = have >= d.count
        caps = np.sort(np.where(allowed, state.unit_cap, 0), axis=1)[:, ::-1]
        whole = caps[:, :d.count].sum(axis=1) * unit
    if d.exclusive:
        memory, core = whole, count * CORE_UNITS_PER_GPU
    else:
        memory, core = count * _slice_mib(d, unit), count * d.core_pct
    out = np.stack([count, memory, core], axis=1).astype(np.int64)
    return np.vstack([out, np.zeros((1, 3), np.int64)]), np.append(possible, False)


def _nominal(state: ClusterState, choice: DeviceChoice, allowed: BoolArray) -> IntArray:
    """The least the alternative takes anywhere: [3] (All: one device)."""
    d = choice.demand
    count = 1 if choice.all_devices else d.count
    if not d.exclusive:
        return np.array([count, count * _slice_mib(d, state.memory_unit_mib),
                         count * d.core_pct], np.int64)
    caps = state.unit_cap[allowed] if allowed.any() else state.unit_cap[state.present]
    smallest = int(caps.min()) * state.memory_unit_mib if caps.size else 0
    return np.array([count, count * smallest, count * CORE_UNITS_PER_GPU], np.int64)


def _slice_mib(d: GpuDemand, unit: int) -> int:
    return -(-d.memory_mib // unit) * unit


def _triple(row: IntArray) -> tuple[int, int, int]:
    return int(row[0]), int(row[1]), int(row[2])


def quota_refusal(catalogue: Catalogue, tenant: str | None, key: str, amounts: Amounts
                  ) -> Reason | None:
    """The core's quota refusal of ``amounts`` (None: they fit): each class's share
    against its class limits, then the total against the tenant's."""
    total, classes = amounts
    for cls, amount in classes:
        if amount == (0, 0, 0):
            continue
        charge = Charge(Amount(*amount), tenant, cls)
        reason = catalogue.quotas.check(charge) or \
            catalogue.tenants.check(catalogue.quotas, charge)
        if reason is not None:
            return reason
    charge = Charge(Amount(*total), tenant)
    return catalogue.quotas.check(charge) or \
        catalogue.tenants.check(catalogue.quotas, charge, key)
