"""DRA plugin benchmark (not a test: it prints figures).

Runs the real DRA plugin of the node agent (gRPC over unix sockets, the FAKE GPU
backend, the FAKE API server over HTTP on loopback, the FAKE kubelet's DRA side from
tests/nodeagent/dra) on a node of 8 GPUs, all in this one process (agent, API server and
kubelet share one interpreter lock: a worst case), and measures:

* NodePrepareResources latency (kubelet's view: the RPC) for one claim — a shared slice
  of 1 GiB and 5 % of one of the 8 GPUs, round robin — over ``--claims`` claims prepared
  one after another, each unprepared again ``--live`` claims later (so ~``--live``
  claims are prepared at any time and every prepare re-checks against them). Baseline
  measured in the same run: an empty round trip (NodeUnprepareResources of a claim that
  is not prepared) and one GET of a ResourceClaim from the API server — the I/O one
  prepare must do besides two more GETs (the pods) and an fsync'd checkpoint;
* health change → ResourceSlice: a GPU made unhealthy (the FAKE GPU file edited, polled
  every 20 ms as the NVML backend's health events would arrive) until the API server
  holds a slice with that device tainted; and recovery until the taint is gone.

Targets: prepare p99 ≤ 10 ms for one claim on 8 GPUs; slice publication ≤ 1 s.

    .venv/bin/python bench/bench_dra.py [--claims 400] [--live 40] [--faults 20]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "testing"))  # gpupool_testing: the fake API server

from gpupool_testing.fake_apiserver import FakeApiServer  # noqa: E402
from nodeagent.builders import NODE, uuid_of, write_gpus  # noqa: E402
from nodeagent.dra.builders import allocated_claim, ref  # noqa: E402
from nodeagent.dra.kubelet_dra import FakeDraKubelet  # noqa: E402

from gpupool.contract import dra  # noqa: E402
from gpupool.kube.api import DraApi  # noqa: E402
from gpupool.nodeagent.dra.claimsource import KubeDraCluster  # noqa: E402
from gpupool.nodeagent.dra.plugin import DraAgent, DraConfig  # noqa: E402
from gpupool.nodeagent.fakegpus import FakeGpuBackend  # noqa: E402

from machine import line  # noqa: E402

GPUS = 8


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def report(name: str, ms: list[float]) -> None:
    print(f"  {name:<44} n={len(ms):>4}  p50 {statistics.median(ms):6.2f} ms  "
          f"p99 {pct(ms, 99):6.2f} ms  max {max(ms):6.2f} ms")


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def bench_prepare(api: FakeApiServer, kubelet: FakeDraKubelet, claims: int, live: int
                  ) -> tuple[list[float], list[float], list[float]]:
    client = DraApi.connect(server=api.url)
    assert isinstance(client, DraApi)
    refs = []
    for i in range(claims):
        claim = allocated_claim(f"c{i}", [dra.device_name(i % GPUS)], memory="1Gi", cores="5")
        api.seed("resourceclaims", claim)
        refs.append(ref(claim))
    empty, get, prepare = [], [], []
    for i, r in enumerate(refs):
        empty.append(timed(lambda: kubelet.unprepare(("bench", "none", "uid-none"))))
        get.append(timed(lambda r=r: client.get_resource_claim(r[0], r[1])))  # type: ignore
        start = time.perf_counter()
        answer = kubelet.prepare(r)[r[2]]
        prepare.append((time.perf_counter() - start) * 1000)
        assert answer.error == "", answer.error
        if i >= live:
            assert kubelet.unprepare(refs[i - live]) == {refs[i - live][2]: ""}
    client.close()
    return empty, get, prepare


def bench_health(api: FakeApiServer, agent: DraAgent, faults: int
                 ) -> tuple[list[float], list[float]]:
    backend: FakeGpuBackend = agent.backend  # type: ignore[assignment]
    down, up = [], []

    def tainted() -> bool:
        obj = api.get("resourceslices", dra.slice_name(NODE)) or {}
        devices = (obj.get("spec") or {}).get("devices") or []
        return any(d["name"] == "gpu-3" and d.get("taints") for d in devices)

    for _ in range(faults):
        for healthy, out in ((False, down), (True, up)):
            start = time.perf_counter()
            backend.set_health(uuid_of(3), healthy, "" if healthy else "XID 79")
            while tainted() == healthy:
                time.sleep(0.001)
                if time.perf_counter() - start > 10:
                    raise SystemExit("the slice did not follow a health change in 10 s")
            out.append((time.perf_counter() - start) * 1000)
    return down, up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=400)
    parser.add_argument("--live", type=int, default=40)
    parser.add_argument("--faults", type=int, default=20)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    print(line("before"))
    with tempfile.TemporaryDirectory(prefix="gp-", dir="/tmp") as tmp, FakeApiServer() as api:
        root = Path(tmp)
        gpus = write_gpus(root / "gpus.yaml", GPUS, 81920)
        client = DraApi.connect(server=api.url)
        assert isinstance(client, DraApi)
        config = DraConfig(NODE, root / "kubelet", root / "cdi", root / "state", watch_s=0.5)
        agent = DraAgent(config, FakeGpuBackend(gpus, poll_s=0.02), KubeDraCluster(client))
        agent.start()
        kubelet = FakeDraKubelet(root / "kubelet")
        try:
            kubelet.discover()
            agent.published.wait(5)
            empty, get, prepare = bench_prepare(api, kubelet, args.claims, args.live)
            down, up = bench_health(api, agent, args.faults)
        finally:
            kubelet.close()
            agent.stop()
            client.close()
    print(f"DRA plugin, {GPUS} GPUs, one process (agent + FAKE API server + FAKE kubelet), "
          f"~{args.live} claims prepared at any time:")
    report("baseline: empty DRA round trip", empty)
    report("baseline: GET ResourceClaim", get)
    report("NodePrepareResources, one shared claim", prepare)
    print(f"  prepare p99 / (round trip + GET) p99: "
          f"{pct(prepare, 99) / (pct(empty, 99) + pct(get, 99)):.1f}x   target p99 <= 10 ms: "
          f"{'met' if pct(prepare, 99) <= 10 else 'MISSED'}")
    print("GPU health change -> ResourceSlice on the API server (file polled every 20 ms):")
    report("unhealthy -> device tainted", down)
    report("healthy again -> taint gone", up)
    print(f"  target <= 1 s: {'met' if max(max(down), max(up)) <= 1000 else 'MISSED'}")
    print(line("after"))


if __name__ == "__main__":
    main()
