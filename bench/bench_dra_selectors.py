"""What reading claims' CEL selectors costs prioritize-claims, and what it changes (prints
figures and ratios measured in the same run).

    .venv/bin/python bench/bench_dra_selectors.py [--nodes 1000] [--repeat 30]
        [--pack-nodes 100] [--pods 1200] [--seeds 1 2 3]

**Cost.** N DRA nodes × 8 GPUs (4 A100 + 4 H100 of 80 GiB each, published in one
ResourceSlice per node with the node agent's attributes), one allocated claim of a
shared slice on every node, in-process (verb handlers called with request bodies, as the
HTTP app calls them). Per pod shape, the median of ``--repeat`` prioritize-claims calls,
every node sent, the state unchanged (steady cluster):

* ``plain``: a claim of a 20 GiB / 25 % slice, no selector — the baseline;
* ``model selector``: the same claim selecting ``model == 'H100'``;
* ``two selectors``: model and ``capacity memory > 40Gi`` (quantity);
* ``firstAvailable``: 2 whole H100s, else a slice of anything;
* ``All``: every H100 of the node;
* ``matchAttribute``: two requests on one NUMA node;
* ``first call, new selector``: a selector never seen, so every GPU's device is read
  again (a fresh memo: what the first pod of a new selector pays), the median of 5.

**Packing.** ``--pack-nodes`` nodes as above, pods arriving one by one (seeded), each a
claim of a shared slice (10/20/40 GiB, 10/25/50 %) selecting H100 (half of them) or A100.
kube-scheduler is modelled as: the nodes where the claim fits (a selected GPU with room)
are feasible; the one gpupool scores highest wins (ties: the first); the allocator takes
the first selected GPU with room, in index order. Two runs per seed on the same arrivals:
gpupool's scores **with** the claim's selector (what is shipped) and **without** it (what
prioritize-claims ranked before: the claim as if it asked any GPU). Printed: how often
gpupool's top-scored node could not hold the claim at all, the GPUs in use and the free
share stranded on partly used GPUs when the first claim is refused, and the claims placed
by then.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
from lightkube.resources.core_v1 import Node

from gpupool.contract import dra
from gpupool.extender.dra.drascores import device_masks
from gpupool.extender.edge.app import verb_handlers
from gpupool.extender.metrics import Metrics
from gpupool.extender.service import Extender, Settings
from gpupool.extender.state.cache import ClusterCache

MODE = {dra.NODE_MODE_LABEL: dra.MODE_DRA}
MODELS = ("A100", "A100", "A100", "A100", "H100", "H100", "H100", "H100")
NS = "bench"


def sel(expression: str) -> dict[str, Any]:
    return {"cel": {"expression": expression}}


MODEL = "device.attributes['gpu.gpupool.io'].model == '{}'"
H100 = MODEL.format("H100")


def node(name: str) -> Any:
    return Node.from_dict({"metadata": {"name": name, "labels": {
        "kubernetes.io/hostname": name, **MODE}},
        "status": {"allocatable": {"cpu": "256", "memory": "2048Gi"}}})


def gpu(name: str, j: int) -> dict[str, Any]:
    return {"metadata": {"name": f"gpu-{name}-{j}", "labels": {"gpupool.io/node": name}},
            "spec": {"node": name, "uuid": f"GPU-{name}-{j}", "index": j, "model": MODELS[j],
                     "memoryMiB": 81920, "labels": MODE},
            "status": {"health": "Healthy"}}


def resource_slice(name: str) -> dict[str, Any]:
    devices = [{"name": f"gpu-{j}", "allowMultipleAllocations": True, "attributes": {
        "model": {"string": MODELS[j]}, "uuid": {"string": f"GPU-{name}-{j}"},
        "index": {"int": j}, "numaNode": {"int": j // 2 % 2},
        "architecture": {"string": "hopper" if MODELS[j] == "H100" else "ampere"},
        "driverVersion": {"version": "570.86.10"},
        "gpupool.io/model": {"string": MODELS[j]}},
        "capacity": {"memory": {"value": "80Gi"}, "cores": {"value": "100"}}}
        for j in range(8)]
    return {"metadata": {"name": dra.slice_name(name)},
            "spec": {"driver": dra.DRIVER, "nodeName": name, "devices": devices,
                     "pool": {"name": name, "generation": 1, "resourceSliceCount": 1}}}


def claim(name: str, requests: list[dict[str, Any]], at: tuple[str, int] | None = None,
          consumed: dict[str, str] | None = None,
          constraints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
                           "spec": {"devices": {"requests": requests}}}
    if constraints:
        obj["spec"]["devices"]["constraints"] = constraints
    if at is not None:
        result: dict[str, Any] = {"driver": dra.DRIVER, "pool": at[0], "device": f"gpu-{at[1]}",
                                  "request": requests[0]["name"]}
        if consumed:
            result["consumedCapacity"] = consumed
        obj["status"] = {"allocation": {"devices": {"results": [result]}}}
    return obj


def exactly(name: str = "gpu", selectors: tuple[str, ...] = (), **more: Any) -> dict[str, Any]:
    ask: dict[str, Any] = {"deviceClassName": dra.DRIVER, **more}
    if selectors:
        ask["selectors"] = [sel(e) for e in selectors]
    return {"name": name, "exactly": ask}


SLICE = {"capacity": {"requests": {"memory": "20Gi", "cores": "25"}}}
SHAPES: dict[str, dict[str, Any]] = {
    "plain": claim("q-plain", [exactly(**SLICE)]),
    "model selector": claim("q-model", [exactly(selectors=(H100,), **SLICE)]),
    "two selectors": claim("q-two", [exactly(selectors=(
        H100, "device.capacity['gpu.gpupool.io'].memory.compareTo(quantity('40Gi')) > 0"),
        **SLICE)]),
    "firstAvailable": claim("q-first", [{"name": "gpu", "firstAvailable": [
        {"name": "big", "deviceClassName": dra.DRIVER, "count": 2, "selectors": [sel(H100)]},
        {"name": "small", "deviceClassName": dra.DRIVER, **SLICE}]}]),
    "All": claim("q-all", [exactly(selectors=(H100,), allocationMode="All")]),
    "matchAttribute": claim("q-numa", [exactly("x"), exactly("y")], constraints=[
        {"requests": ["x", "y"], "matchAttribute": "gpu.gpupool.io/numaNode"}]),
}


def pod(claim_name: str, uid: str = "p") -> dict[str, Any]:
    return {"metadata": {"name": uid, "namespace": NS, "uid": f"uid-{uid}"},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
                     "containers": [{"name": "c", "resources": {
                         "requests": {"cpu": "1", "memory": "1Gi"},
                         "claims": [{"name": "gpu"}]}}]}}


def cluster(n: int) -> tuple[ClusterCache, list[str]]:
    names = [f"n{i:05d}" for i in range(n)]
    cache = ClusterCache()
    cache.sync_nodes([node(x) for x in names])
    cache.sync_devices([gpu(x, j) for x in names for j in range(8)])
    with cache.lock:
        cache.dra.sync_slices(cache, [resource_slice(x) for x in names])
    return cache, names


def timed(fn: Callable[[], Any], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def cost(n: int, repeat: int) -> None:
    cache, names = cluster(n)
    held = [claim(f"h-{x}", [exactly(**SLICE)], at=(x, i % 8),
                  consumed={"memory": "20Gi", "cores": "25"}) for i, x in enumerate(names)]
    with cache.lock:
        cache.dra.sync_claims(cache, [*held, *SHAPES.values()])
    verb = verb_handlers(Extender(cache, Settings("fgd-balance"), Metrics()))["prioritize-claims"]
    rows = []
    for label, obj in SHAPES.items():
        body = msgspec.json.encode({"Pod": pod(obj["metadata"]["name"]), "NodeNames": names})
        answer = msgspec.json.decode(verb(body))
        assert answer, f"{label}: no node scored"
        rows.append((label, timed(lambda b=body: verb(b), repeat), len(answer)))
    cold = []
    for k in range(5):
        expression = f"device.attributes['gpu.gpupool.io'].index >= {k} && {H100}"
        fresh = claim(f"q-cold-{k}", [exactly(selectors=(expression,), **SLICE)])
        with cache.lock:
            cache.dra.claim_event(cache, "ADDED", fresh)
        body = msgspec.json.encode({"Pod": pod(f"q-cold-{k}"), "NodeNames": names})
        t0 = time.perf_counter()
        verb(body)
        cold.append((time.perf_counter() - t0) * 1e3)
    evaluations = device_masks(cache.dra).selectors.evaluations
    base = rows[0][1]
    print(f"{n} DRA nodes × 8 GPUs (4 A100 + 4 H100), {len(held)} allocated claims")
    for label, ms, scored in rows:
        print(f"  {label:28s} {ms:8.2f} ms  {ms / base:5.2f}×  ({scored} nodes scored)")
    ms = statistics.median(cold)
    print(f"  {'first call, new selector':28s} {ms:8.2f} ms  {ms / base:5.2f}×  "
          f"(CEL evaluations in the whole run: {evaluations} for {n * 8} GPUs)")


def fits(state: Any, row: int, model: str, memory_mib: int, cores: int) -> list[int]:
    """Positions of the node's GPUs of ``model`` with room for the slice (index order)."""
    node_ = state.nodes[row]
    units = state.units_for(memory_mib)
    return [p for p, g in enumerate(node_.gpus) if g.model == model
            and state.unit_free[row, p] >= units and state.core_free[row, p] >= cores]


def pack(n: int, pods: int, seed: int, with_selectors: bool) -> dict[str, float]:
    cache, names = cluster(n)
    ext = Extender(cache, Settings("fgd-balance"), Metrics())
    verb = verb_handlers(ext)["prioritize-claims"]
    rng = random.Random(seed)
    wrong_top = placed = 0
    refused_at: dict[str, float] | None = None
    for k in range(pods):
        model = rng.choice(("H100", "A100"))
        memory, cores = rng.choice((10, 20, 40)), rng.choice((10, 25, 50))
        shape = {"capacity": {"requests": {"memory": f"{memory}Gi", "cores": str(cores)}}}
        asked = claim(f"c{k}", [exactly(selectors=(MODEL.format(model),), **shape)])
        scored = claim(f"c{k}", [exactly(selectors=(MODEL.format(model),) if with_selectors
                                         else (), **shape)])
        with cache.lock:
            cache.dra.claim_event(cache, "ADDED", scored)
        body = msgspec.json.encode({"Pod": pod(f"c{k}", f"p{k}"), "NodeNames": names})
        score = {h["Host"]: h["Score"] for h in msgspec.json.decode(verb(body))}
        state = cache.state
        feasible = [x for x in names if fits(state, state.index[x], model, memory * 1024, cores)]
        top = max(names, key=lambda x: score.get(x, 0)) if score else None
        if top is not None and top not in feasible:
            wrong_top += 1
        if not feasible:
            if refused_at is None:
                refused_at = usage(state) | {"placed": placed}
            with cache.lock:
                cache.dra.claim_event(cache, "DELETED", asked)
            continue
        chosen = max(feasible, key=lambda x: score.get(x, 0))
        p = fits(state, state.index[chosen], model, memory * 1024, cores)[0]
        with cache.lock:
            cache.dra.claim_event(cache, "ADDED", claim(
                f"c{k}", asked["spec"]["devices"]["requests"], at=(chosen, p),
                consumed={"memory": f"{memory}Gi", "cores": str(cores)}))
        placed += 1
    out = refused_at or usage(cache.state) | {"placed": placed}
    return out | {"wrong_top": wrong_top / pods}


def usage(state: Any) -> dict[str, float]:
    used = state.present & ((state.core_free < state.core_cap) |
                            (state.unit_free < state.unit_cap))
    free_share = np.minimum(state.core_free / np.maximum(state.core_cap, 1),
                            state.unit_free / np.maximum(state.unit_cap, 1))
    stranded = float((free_share * used).sum()) / float(state.present.sum())
    return {"gpus_used": float(used.sum()), "stranded": 100 * stranded}


def packing(n: int, pods: int, seeds: list[int]) -> None:
    print(f"\npacking: {n} nodes × 8 GPUs (4 A100 + 4 H100), {pods} arrivals, seeds {seeds}")
    results = {True: [], False: []}  # type: dict[bool, list[dict[str, float]]]
    for seed in seeds:
        for flag in (True, False):
            results[flag].append(pack(n, pods, seed, flag))
    for flag, label in ((True, "with the claim's selector"), (False, "selector not read")):
        rs = results[flag]

        def stat(key: str, rs: list[dict[str, float]] = rs) -> str:
            values = [r[key] for r in rs]
            return f"{statistics.mean(values):.2f} ± {statistics.pstdev(values):.2f}"

        print(f"  {label:26s} top node cannot hold the claim: {stat('wrong_top')} "
              f"(share of arrivals); at the first refusal: placed {stat('placed')}, "
              f"GPUs in use {stat('gpus_used')}, stranded {stat('stranded')} %")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--pack-nodes", type=int, default=100)
    p.add_argument("--pods", type=int, default=1200)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    args = p.parse_args()
    cost(args.nodes, args.repeat)
    if args.pods:
        packing(args.pack_nodes, args.pods, args.seeds)


if __name__ == "__main__":
    main()
