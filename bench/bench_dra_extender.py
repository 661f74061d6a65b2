"""What DRA accounting and DRA scoring cost the extender's calls (prints figures and ratios).

    .venv/bin/python bench/bench_dra_extender.py [--nodes 1000 5000] [--pods 200]

A cluster of N nodes × 8 GPUs of 80 GiB, in-process (verb handlers called with request
bodies, as the HTTP app calls them). Measured in the same run, per N:

* ``filter, no DRA node``: filter of a shared device-plugin pod, every node sent, on a
  cluster without DRA nodes — the baseline;
* ``filter, half full``: the same pod when half the nodes are full (refused for want of
  GPU room): what refusing half the nodes costs anyway — the fair baseline of the next;
* ``filter, half DRA``: the same pod when half the nodes are DRA nodes (refused with the
  node-mode reason) and hold one allocated claim per GPU;
* ``prioritize``: the device-plugin pod's prioritize, every node sent (baseline of the next);
* ``prioritize-claims``: a pod with one unallocated claim of the same shape, every node
  sent (half of them DRA nodes, the others left out);
* ``claims listed``: taking in the listing of N/2 × 8 allocated claims (the extender's
  start), once.

Every call repeats one body on an unchanged state, so the extender's caches (feasibility
per request shape, refusal sentences per node version, the node-name table) are warm:
these are the figures of a steady cluster, not of a cluster changing between calls.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import msgspec
from lightkube.resources.core_v1 import Node

from gpupool.contract import dra
from gpupool.core.allocation import Allocation, Slice
from gpupool.extender.edge.app import verb_handlers
from gpupool.extender.metrics import Metrics
from gpupool.extender.service import Extender, Settings
from gpupool.extender.state.cache import ClusterCache

MODE = {dra.NODE_MODE_LABEL: dra.MODE_DRA}


def node(name: str, is_dra: bool) -> Any:
    labels = {"kubernetes.io/hostname": name, **(MODE if is_dra else {})}
    return Node.from_dict({"metadata": {"name": name, "labels": labels},
                           "status": {"allocatable": {"cpu": "64", "memory": "512Gi"}}})


def gpu(name: str, j: int, is_dra: bool) -> dict[str, Any]:
    return {"metadata": {"name": f"gpu-{name}-{j}", "labels": {"gpupool.io/node": name}},
            "spec": {"node": name, "uuid": f"GPU-{name}-{j}", "index": j, "model": "A100",
                     "memoryMiB": 81920, "labels": MODE if is_dra else {}},
            "status": {"health": "Healthy"}}


def claim(name: str, node_name: str | None, j: int = 0) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "bench", "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.gpupool.io",
            "capacity": {"requests": {"memory": "20Gi", "cores": "25"}}}}]}}}
    if node_name is not None:
        obj["status"] = {"allocation": {"devices": {"results": [{
            "driver": dra.DRIVER, "pool": node_name, "device": f"gpu-{j}", "request": "gpu",
            "consumedCapacity": {"memory": "20Gi", "cores": "25"}}]}}}
    return obj


def cluster(n: int, with_dra: bool) -> tuple[ClusterCache, list[str], list[dict[str, Any]]]:
    names = [f"n{i:05d}" for i in range(n)]
    dra_nodes = set(names[: n // 2]) if with_dra else set()
    cache = ClusterCache()
    cache.sync_nodes([node(x, x in dra_nodes) for x in names])
    cache.sync_devices([gpu(x, j, x in dra_nodes) for x in names for j in range(8)])
    claims = [claim(f"c-{x}-{j}", x, j) for x in sorted(dra_nodes) for j in range(8)]
    return cache, names, claims


def timed(fn: Callable[[], Any], repeat: int) -> float:
    """Median ms of ``repeat`` calls."""
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def body(pod: dict[str, Any], names: list[str]) -> bytes:
    return msgspec.json.encode({"Pod": pod, "NodeNames": names})


def plugin_pod() -> dict[str, Any]:
    limits = {"gpupool.io/gpu-memory": "20480", "gpupool.io/gpu-core": "25"}
    return {"metadata": {"name": "p", "namespace": "bench", "uid": "uid-p"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}


def claim_pod() -> dict[str, Any]:
    return {"metadata": {"name": "q", "namespace": "bench", "uid": "uid-q"},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "new"}],
                     "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}]}}


def measure(n: int, repeat: int) -> None:
    plain, names, _ = cluster(n, with_dra=False)
    full, _, _ = cluster(n, with_dra=False)
    with full.lock:
        for x in names[: n // 2]:
            full.hold(Allocation(f"busy-{x}", x, 0, 0, tuple(
                Slice(f"GPU-{x}-{j}", j, 81920, 100) for j in range(8)), True), "pod")
    mixed, _, claims = cluster(n, with_dra=True)
    t0 = time.perf_counter()
    with mixed.lock:
        mixed.dra.sync_claims(mixed, [*claims, claim("new", None)])
    listed_ms = (time.perf_counter() - t0) * 1e3
    verbs = {k: verb_handlers(Extender(c, Settings("fgd-balance"), Metrics()))
             for k, c in (("plain", plain), ("full", full), ("mixed", mixed))}
    dp, dra_pod = body(plugin_pod(), names), body(claim_pod(), names)
    scored = msgspec.json.decode(verbs["mixed"]["prioritize-claims"](dra_pod))
    assert scored and all(h["Host"] < names[n // 2] for h in scored), "DRA nodes only"
    answer = msgspec.json.decode(verbs["mixed"]["filter"](dp))
    assert answer["NodeNames"] == names[n // 2:], "device-plugin nodes only"
    assert len(answer["FailedAndUnresolvableNodes"]) == n // 2
    rows = [
        ("filter, no DRA node", timed(lambda: verbs["plain"]["filter"](dp), repeat)),
        ("filter, half full", timed(lambda: verbs["full"]["filter"](dp), repeat)),
        ("filter, half DRA", timed(lambda: verbs["mixed"]["filter"](dp), repeat)),
        ("prioritize (device plugin)", timed(lambda: verbs["mixed"]["prioritize"](dp), repeat)),
        ("prioritize-claims", timed(lambda: verbs["mixed"]["prioritize-claims"](dra_pod),
                                    repeat)),
    ]
    print(f"{n} nodes × 8 GPUs, {len(claims)} allocated claims taken in in {listed_ms:.0f} ms")
    for label, ms in rows:
        print(f"  {label:28s} {ms:7.2f} ms")
    print(f"  ratios: filter half DRA / half full {rows[2][1] / rows[1][1]:.2f}×, "
          f"half DRA / no DRA {rows[2][1] / rows[0][1]:.2f}×, "
          f"prioritize-claims / prioritize {rows[4][1] / rows[3][1]:.2f}×")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    p.add_argument("--repeat", type=int, default=30)
    args = p.parse_args()
    for n in args.nodes:
        measure(n, args.repeat)


if __name__ == "__main__":
    main()
