"""Benchmark of a bind's QuotaLedger admission in a big quota scope: one object (as
before shards) against a head that moves its entries to shards.

    .venv/bin/python bench/bench_quotaledger.py [--entries 2500] [--binds 200]

The fake API server runs in a child process (``python -m gpupool_testing.fake_apiserver``)
so its CPU is not counted against the client. Two scopes ``tenant.single`` and
``tenant.sharded`` start from the same single-object ledger of ``--entries`` one-GPU
entries (binds another replica made moments ago, so every one counts: about 1.3 MB at
2,500, near the API server's 1.5 MiB object limit). ``QuotaGate.admit`` then admits
``--binds`` new one-GPU charges in each, alternating between them in the same run:
``single`` with moving turned off (every bind's compare-and-swap carries and answers the
whole object, the behaviour before shards), ``sharded`` with the default head size (its
first bind moves the old ledger to shards; that bind is the warm-up and not timed). p50 /
p99 / mean wall time per admission, and the ratio single / sharded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

from bench_extender import FakeApi  # the script's folder is on sys.path

from gpupool.core.allocation import Allocation, Slice
from gpupool.core.quota import Limit
from gpupool.core.tenants import TenantQuota
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.state.ledger import Entry
from gpupool.extender.tenancy.quotaledger import QuotaGate, QuotaLedgers
from gpupool.kube.api import KubeApi

from machine import line as machine_line

NOW = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def entry(k: int, tenant: str) -> tuple[str, Entry]:
    uid = str(uuid.UUID(int=k + 1))
    alloc = Allocation(uid, f"gpu-node-{k // 8:04d}", 1000, 1024,
                       (Slice(f"GPU-{uuid.UUID(int=k)}", k % 8, 81920, 100, "trainer"),),
                       exclusive=True)
    return uid, Entry(alloc, f"{tenant}/trainer-{k:05d}", NOW, tenant)


def seed(entries: int) -> Iterator[str]:
    for name in ("single", "sharded"):
        raw = dict((u, e.to_json()) for u, e in (entry(k, name) for k in range(entries)))
        yield json.dumps({"kind": "quotaledgers", "object": {
            "metadata": {"name": f"tenant.{name}"},
            "spec": {"scope": f"tenant {name}", "entries": raw}}})


def gate(api: KubeApi, name: str, move_at: int) -> QuotaGate:
    cache = ClusterCache()
    cache.catalogue.tenants.put(TenantQuota(name, frozenset({name}), Limit(gpus=10**6)))
    return QuotaGate(cache, QuotaLedgers(api, move_at=move_at), attempts=4)


def figures(times_s: list[float]) -> str:
    ms = sorted(t * 1000 for t in times_s)
    return (f"p50 {statistics.median(ms):7.2f} ms  p99 {ms[int(len(ms) * 0.99) - 1]:7.2f} ms"
            f"  mean {statistics.fmean(ms):7.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=2500)
    parser.add_argument("--binds", type=int, default=200)
    args = parser.parse_args()
    print(machine_line("before"))
    fake = FakeApi(seed(args.entries))
    api = KubeApi.connect(server=fake.url)
    gates = {"single": gate(api, "single", 10**9), "sharded": gate(api, "sharded", 256)}
    times: dict[str, list[float]] = {"single": [], "sharded": []}
    try:
        for k in range(args.binds + 1):
            for name, g in gates.items():
                key, new = entry(10**6 + k, name)
                began = time.perf_counter()
                written, why = g.admit(key, new)
                took = time.perf_counter() - began
                assert written and not why, why
                if k:
                    times[name].append(took)
        sizes = {o["metadata"]["name"]: len(json.dumps(o)) for o in
                 (dict(x) for x in api.list_quota_ledgers().items)}
    finally:
        api.close()
        fake.close()
    print(f"scope of {args.entries} live one-GPU entries, {args.binds} admissions each")
    for name, ts in times.items():
        print(f"  {name:8s} {figures(ts)}")
    ratio = statistics.median(times["single"]) / statistics.median(times["sharded"])
    print(f"  single / sharded (p50): {ratio:.1f}x")
    print("  objects (bytes): " + ", ".join(f"{n} {b:,}" for n, b in sorted(sizes.items())))
    print(machine_line("after"))


if __name__ == "__main__":
    main()
