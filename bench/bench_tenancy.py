"""Benchmark of tenancy's cost on the extender's decisions: filter + prioritize of one pod
with tenant quotas and cohorts active, against the same calls without them.

    .venv/bin/python bench/bench_tenancy.py [--nodes 1000] [--pods 200] [--repeat 5]
                                            [--exact-fair]

A cluster of N nodes × 8 A100 (80 GiB), half its GPUs held by pods of 60 namespaces (slices
of 10-40 GiB, their quota charged). Three extenders over equal copies of it:

* ``plain``: no TenantQuota, no GPUPermission (the baseline, measured in the same run);
* ``quotas``: 20 TenantQuotas of 3 namespaces each, in 2 cohorts with borrowing and lending
  limits and a per-class limit — every pod is checked against its tenant's quota and its
  cohort's arithmetic (``core.tenants``, ``core.cohort``);
* ``permissions``: ``quotas`` plus a GPUPermission per tenant confining it to half the
  nodes (by a node label) — its own figure: it changes which nodes are candidates;
* ``fair``: ``quotas`` with ``fairSharing`` on in both cohorts, weights 1-4, and half the
  tenants given a nominal below what they hold, so that every pod of theirs borrows and is
  checked against its fair share (``core.tenantshare``) over the asks of all the round's
  pods, which wait (pending, unbound) the whole time. The cohorts lend far more than is
  borrowed and waits, so the check's shortcuts (``TenantBook._fair_surely``,
  ``tenantshare.surely_within``) admit; ``--exact-fair`` turns them off, so that every
  borrowing pod pays for the whole division (the cost in a cohort whose lending is
  contended).

Each round sends every pod (shared slices of 4-16 GiB, tenants round robin) through filter
then prioritize with every node, the extenders in turn; the medians of ``--repeat``
rounds (CPU time of this process, each extender going first in turn) are printed per
pod, with the ratio to ``plain``. The ``permissions`` row makes a different decision: half
the nodes are refused, and their reasons are explained (kube-scheduler shows them), which
costs what a class-restricted pod's refusals cost.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from gpupool.core.allocation import Allocation, Slice
from gpupool.core.model import uniform_node
from gpupool.core.quota import Charge, amount_of_allocation
from gpupool.core.state import ClusterState
from gpupool.extender.metrics import Metrics
from gpupool.extender.service import Extender, Settings
from gpupool.extender.state.cache import ClusterCache

GIB = 1024
NAMESPACES = [f"ns-{i}" for i in range(60)]


def cluster(nodes: int, seed: int) -> tuple[ClusterState, list[tuple[Allocation, str]]]:
    rng = random.Random(seed)
    state = ClusterState([uniform_node(f"n{i}", 64000, 512 * GIB, 8, "A100", 80 * GIB,
                                       {"half": str(i % 2)}) for i in range(nodes)])
    held = []
    for node in state.nodes:
        for j, gpu in enumerate(node.gpus[:4]):
            mib = rng.choice((10, 20, 40)) * GIB
            alloc = Allocation(f"{node.name}-{j}", node.name, 0, 0,
                               (Slice(gpu.uuid, j, mib, 25),))
            state.reserve(alloc)
            held.append((alloc, rng.choice(NAMESPACES)))
    return state, held


def extender(nodes: int, seed: int, tenancy: str, waiting: list[dict[str, Any]]) -> Extender:
    state, held = cluster(nodes, seed)
    cache = ClusterCache()
    cache.state = state
    for alloc, ns in held:
        cache.catalogue.quotas.charge(alloc.key, Charge(amount_of_allocation(alloc), ns))
    if tenancy != "plain":
        for t in range(20):
            cache.tenant_quota_event("ADDED", {"metadata": {"name": f"team-{t}"}, "spec": {
                "namespaces": NAMESPACES[3 * t:3 * t + 3], "cohort": f"c{t % 2}",
                "limits": {"gpus": 10 * nodes, "memoryMiB": 10**9},
                "borrowingLimit": {"gpus": nodes}, "lendingLimit": {"gpus": nodes},
                "classes": {"a100": {"gpus": 10 * nodes}}, **_fair(tenancy, t, nodes)}})
    if tenancy == "fair":
        cache.unbound.update({p["metadata"]["uid"]: p for p in waiting})
    if tenancy == "permissions":
        for t in range(20):
            cache.permission_event("ADDED", {"metadata": {"name": f"perm-{t}"}, "spec": {
                "tenants": NAMESPACES[3 * t:3 * t + 3],
                "nodeSelector": {"matchLabels": {"half": str(t % 2)}}}})
    return Extender(cache, Settings("best-fit"), Metrics())


def _fair(tenancy: str, t: int, nodes: int) -> dict[str, Any]:
    """The ``fair`` kind's changes to team ``t``'s spec: fair sharing, a weight, and for
    half the teams a nominal of 50 GPUs per 1,000 nodes (they hold about 200)."""
    if tenancy != "fair":
        return {}
    spec: dict[str, Any] = {"fairSharing": True, "weight": 1 + t % 4}
    if (t // 2) % 2:
        spec["limits"] = {"gpus": max(nodes // 20, 1), "memoryMiB": 10**9}
    return spec


def pods(count: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for k in range(count):
        limits = {"gpupool.io/gpu-memory": str(rng.choice((4, 8, 16)) * GIB),
                  "gpupool.io/gpu-core": "20"}
        out.append({"metadata": {"name": f"p{k}", "namespace": NAMESPACES[k % 60],
                                 "uid": f"p{k}"},
                    "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}})
    return out


def round_ms(ext: Extender, calls: list[dict[str, Any]], names: list[str]) -> float:
    start = time.process_time()  # CPU time: other processes on the machine count less
    for pod in calls:
        answer = ext.filter({"Pod": pod, "NodeNames": names})
        assert answer["NodeNames"], answer["FailedNodes"]
        ext.prioritize({"Pod": pod, "NodeNames": answer["NodeNames"]})
    return (time.process_time() - start) * 1000 / len(calls)


def run(nodes: int, count: int, repeat: int, seed: int) -> None:
    kinds = ("plain", "quotas", "permissions", "fair")
    calls = pods(count, seed)
    exts = {k: extender(nodes, seed, k, calls) for k in kinds}
    names = [f"n{i}" for i in range(nodes)]
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for k in kinds:  # warm the caches (masks, name tables) once
        round_ms(exts[k], calls[:5], names)
    for r in range(repeat):
        for k in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:  # each goes first in turn
            times[k].append(round_ms(exts[k], calls, names))
    base = statistics.median(times["plain"])
    for k in kinds:
        ms = statistics.median(times[k])
        print(f"{nodes:5d} nodes  {k:11s}  filter+prioritize {ms:7.2f} ms/pod  "
              f"ratio {ms / base:5.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000])
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exact-fair", action="store_true",
                        help="fair: divide for every borrowing pod (no shortcut)")
    args = parser.parse_args()
    if args.exact_fair:
        import gpupool.core.tenants as tenants
        tenants.surely_within = lambda *_: False  # type: ignore[assignment]
        tenants.TenantBook._fair_surely = lambda *_: False  # type: ignore[method-assign]
    for n in args.nodes:
        run(n, args.pods, args.repeat, args.seed)


if __name__ == "__main__":
    main()
