"""The extender's filter and prioritize for remote-required pods, against local pods (the
baseline, measured in the same run on the same cluster; prints figures, asserts nothing).

A cluster of N GPU nodes (8 × 40 GiB each) and N/4 nodes without GPUs, in 4 zones, built in
the extender's own cache (no API server): every call is ``Extender.filter_json`` /
``prioritize_json`` on a body naming every node, as kube-scheduler sends it with
``percentageOfNodesToScore: 100``. Two fills: half the GPUs' memory taken (most nodes pass),
and every GPU full (every node refused: filter explains each one). Printed: the median
time per call of a local pod and of a remote-required pod of the same size, and their ratio.

    .venv/bin/python bench/bench_remote_extender.py [--nodes 5000] [--calls 30]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import msgspec
from lightkube.resources.core_v1 import Node

from gpupool.core.allocation import Allocation, Slice
from gpupool.core.serving import ZONE_LABEL, ServingConfig
from gpupool.extender.metrics import Metrics
from gpupool.extender.service import Extender, Settings
from gpupool.extender.state.cache import ClusterCache

GIB = 1024


def node(name: str, zone: str) -> Node:
    return Node.from_dict({"metadata": {"name": name, "labels": {ZONE_LABEL: zone}},
                           "status": {"allocatable": {"cpu": "64", "memory": "512Gi"}}})


def device(node_name: str, j: int) -> dict[str, Any]:
    uuid = f"GPU-{node_name}-{j}"
    return {"metadata": {"name": uuid.lower()},
            "spec": {"node": node_name, "uuid": uuid, "index": j, "model": "A100",
                     "memoryMiB": 40 * GIB}, "status": {"health": "Healthy"}}


def extender(gpu_nodes: int, fill_mib: int) -> tuple[Extender, list[str]]:
    cache = ClusterCache(stale_after_s=1e9)
    gpus = [f"g{i}" for i in range(gpu_nodes)]
    cpus = [f"c{i}" for i in range(gpu_nodes // 4)]
    names = gpus + cpus
    cache.sync_nodes([node(n, f"z{k % 4}") for k, n in enumerate(names)])
    cache.sync_devices([device(n, j) for n in gpus for j in range(8)])
    ext = Extender(cache, Settings("fgd-balance", serving=ServingConfig(True)), Metrics())
    with cache.lock:
        cache.flush()
        for n in gpus:
            slices = tuple(Slice(f"GPU-{n}-{j}", j, fill_mib, 0) for j in range(8))
            cache.hold(Allocation(f"fill-{n}", n, 0, 0, slices), "pod")
    return ext, names


def body(names: list[str], remote: bool, k: int) -> bytes:
    limits = {("gpupool.io/remote-gpu" if remote else "gpupool.io/gpu"): "1",
              "gpupool.io/gpu-memory": "8192"}
    notes = {"gpupool.io/placement": "remote-required"} if remote else {}
    pod = {"metadata": {"name": f"p{k}", "namespace": "lab", "uid": f"u{k}",
                        "annotations": notes},
           "spec": {"containers": [{"name": "main", "resources": {
               "limits": limits, "requests": {"cpu": "1", "memory": "1Gi", **limits}}}]}}
    return msgspec.json.encode({"Pod": pod, "NodeNames": names})


def median_ms(call: Any, bodies: list[bytes]) -> float:
    times = []
    for b in bodies:
        t = time.perf_counter()
        call(b)
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--calls", type=int, default=30)
    args = p.parse_args()
    print("| fill | verb | local pod (ms) | remote-required pod (ms) | ratio |")
    print("|---|---|---:|---:|---:|")
    for label, fill in (("half the GPU memory taken", 20 * GIB), ("every GPU full", 40 * GIB)):
        ext, names = extender(args.nodes, fill)
        for verb, call in (("filter", ext.filter_json), ("prioritize", ext.prioritize_json)):
            local = median_ms(call, [body(names, False, k) for k in range(args.calls)])
            remote = median_ms(call, [body(names, True, k) for k in range(args.calls)])
            print(f"| {label} | {verb} | {local:.1f} | {remote:.1f} | {remote / local:.2f} |")


if __name__ == "__main__":
    main()
