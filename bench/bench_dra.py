"""DRA plugin benchmark (not a test: it prints figures).

Runs the real DRA plugin of the node agent (gRPC over unix sockets, the FAKE GPU
backend, the FAKE API server over HTTP on loopback, the FAKE kubelet's DRA side from
tests/nodeagent/dra) on a node of 8 GPUs, in two layouts, one after the other in the
same run:

* ``split`` (as deployed): the agent in its own process, the FAKE API server in another,
  the FAKE kubelet (and this script's timing) in a third;
* ``one``: all three in this one process, sharing one interpreter lock (a worst case).

In each it measures:

* NodePrepareResources latency (kubelet's view: the RPC) for one claim — a shared slice
  of 1 GiB and 5 % of one of the 8 GPUs, round robin — over ``--claims`` claims prepared
  one after another, each unprepared again ``--live`` claims later (so ~``--live``
  claims are prepared at any time and every prepare re-checks against them). Baselines
  measured in the same run and layout: an empty round trip (NodeUnprepareResources of a
  claim that is not prepared) and one GET of a ResourceClaim from the API server — the
  I/O one prepare must do besides the GETs of the pods the claim is reserved for (none
  here) and its checkpoint file;
* health change → ResourceSlice: a GPU made unhealthy (the FAKE GPU file edited, polled
  every 20 ms as the NVML backend's health events would arrive) until the API server
  holds a slice with that device tainted; and recovery until the taint is gone.

Each layout runs ``--repeat`` times as the plugin is and as many times as earlier
versions prepared (the baseline, same run, alternating order, samples pooled): the
whole checkpoint file of every claim rewritten and the node's state rebuilt from every
prepared claim at each prepare. Then, in this process: the preparer alone (called
directly, the claims in memory: prepare's own work without HTTP or gRPC), before and
now; and the checkpoint write of one prepare with ``--live`` claims held, one claim
file (what the plugin does) against the whole file of every claim (what earlier
versions wrote, reproduced here).

Targets: prepare p99 ≤ 10 ms for one claim on 8 GPUs; slice publication ≤ 1 s.

    .venv/bin/python bench/bench_dra.py [--claims 400] [--live 40] [--faults 20]
                                        [--layout both|split|one] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
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
from gpupool.nodeagent.dra.cdi import CdiSpecs  # noqa: E402
from gpupool.nodeagent.dra.checkpoint import (  # noqa: E402
    Checkpoint,
    PreparedClaim,
    PreparedDevice,
    _claim_json,
    _digest,
)
from gpupool.nodeagent.dra.claimsource import KubeDraCluster  # noqa: E402
from gpupool.nodeagent.dra.plugin import DraAgent, DraConfig  # noqa: E402
from gpupool.nodeagent.dra.preparer import PrepareConfig, Preparer  # noqa: E402
from gpupool.nodeagent.envs import ContainerEdits  # noqa: E402
from gpupool.nodeagent.exposure import Exposure  # noqa: E402
from gpupool.nodeagent.fakegpus import FakeGpuBackend  # noqa: E402
from gpupool.nodeagent.isolation.none import NoIsolation  # noqa: E402

from machine import line  # noqa: E402

GPUS = 8
Api = Any  # a FakeApiServer, or ApiProxy to one in another process


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


# -- the processes of the split layout ------------------------------------------------------
def api_process(conn: Any) -> None:
    """The FAKE API server in its own process, seeded and read through a pipe."""
    with FakeApiServer() as api:
        conn.send(api.url)
        while True:
            op, *args = conn.recv()
            if op == "stop":
                return
            conn.send(getattr(api, op)(*args))


class ApiProxy:
    def __init__(self, conn: Any, url: str):
        self.conn, self.url = conn, url

    def seed(self, plural: str, obj: dict[str, Any]) -> Any:
        self.conn.send(("seed", plural, obj))
        return self.conn.recv()

    def get(self, plural: str, name: str) -> Any:
        self.conn.send(("get", plural, name))
        return self.conn.recv()


def agent_process(root: str, url: str, whole: bool, ready: Any, stop: Any) -> None:
    """The DRA agent in its own process, as a node runs it."""
    logging.basicConfig(level=logging.ERROR)
    agent, client = make_agent(Path(root), url, whole)
    agent.start()
    agent.published.wait(5)
    ready.set()
    stop.wait()
    agent.stop()
    client.close()


def make_agent(root: Path, url: str, whole: bool) -> tuple[DraAgent, DraApi]:
    """The agent; ``whole``: as earlier versions prepared (the baseline)."""
    client = DraApi.connect(server=url)
    assert isinstance(client, DraApi)
    config = DraConfig(NODE, root / "kubelet", root / "cdi", root / "state", watch_s=0.5)
    agent = DraAgent(config, FakeGpuBackend(root / "gpus.yaml", poll_s=0.02),
                     KubeDraCluster(client))
    if whole:  # earlier versions: every claim rewritten, the node state rebuilt, each time
        preparer = agent.preparer
        preparer.checkpoint = WholeFileCheckpoint(config.legacy_checkpoint)
        preparer._follow = lambda claim, added: setattr(  # type: ignore[method-assign]
            preparer, "_cached", None)
    return agent, client


# -- the measurements -----------------------------------------------------------------------
def bench_prepare(api: Api, kubelet: FakeDraKubelet, claims: int, live: int
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


def bench_health(api: Api, backend: FakeGpuBackend, faults: int
                 ) -> tuple[list[float], list[float]]:
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


Figures = dict[str, list[float]]


def run_one(root: Path, args: argparse.Namespace, whole: bool) -> Figures:
    with FakeApiServer() as api:
        agent, client = make_agent(root, api.url, whole)
        agent.start()
        kubelet = FakeDraKubelet(root / "kubelet")
        try:
            kubelet.discover()
            agent.published.wait(5)
            return measure(api, kubelet, agent.backend, args)  # type: ignore[arg-type]
        finally:
            kubelet.close()
            agent.stop()
            client.close()


def run_split(root: Path, args: argparse.Namespace, whole: bool) -> Figures:
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    server = ctx.Process(target=api_process, args=(there,), daemon=True)
    server.start()
    api = ApiProxy(here, here.recv())
    ready, stop = ctx.Event(), ctx.Event()
    agent = ctx.Process(target=agent_process, args=(str(root), api.url, whole, ready, stop),
                        daemon=True)
    agent.start()
    kubelet = FakeDraKubelet(root / "kubelet")
    try:
        if not ready.wait(30):
            raise SystemExit("the agent process did not start in 30 s")
        kubelet.discover()
        return measure(api, kubelet, FakeGpuBackend(root / "gpus.yaml"), args)
    finally:
        kubelet.close()
        stop.set()
        agent.join(10)
        here.send(("stop",))
        server.join(10)


def measure(api: Api, kubelet: FakeDraKubelet, backend: FakeGpuBackend,
            args: argparse.Namespace) -> Figures:
    empty, get, prepare = bench_prepare(api, kubelet, args.claims, args.live)
    down, up = bench_health(api, backend, args.faults)
    return {"empty": empty, "get": get, "prepare": prepare, "down": down, "up": up}


def print_layout(title: str, f: Figures) -> None:
    print(title)
    report("baseline: empty DRA round trip", f["empty"])
    report("baseline: GET ResourceClaim", f["get"])
    report("NodePrepareResources, one shared claim", f["prepare"])
    p99 = pct(f["prepare"], 99)
    print(f"  prepare p99 / (round trip + GET) p99: "
          f"{p99 / (pct(f['empty'], 99) + pct(f['get'], 99)):.1f}x   target p99 <= 10 ms: "
          f"{'met' if p99 <= 10 else 'MISSED'}")
    print("  GPU health change -> ResourceSlice on the API server (file polled every 20 ms):")
    report("unhealthy -> device tainted", f["down"])
    report("healthy again -> taint gone", f["up"])
    print(f"  target <= 1 s: {'met' if max(max(f['down']), max(f['up'])) <= 1000 else 'MISSED'}")


# -- the checkpoint on its own -----------------------------------------------------------------
def claim(i: int) -> PreparedClaim:
    return PreparedClaim(f"uid-c{i}", "bench", f"c{i}", (PreparedDevice(
        "gpu", NODE, dra.device_name(i % GPUS), uuid_of(i % GPUS), 1024, 5, False,
        (f"gpu.gpupool.io/claim=uid-c{i}",)),), ContainerEdits({
            "GPUPOOL_CLAIM": f"bench/c{i}", "GPUPOOL_GPU_UUIDS": uuid_of(i % GPUS),
            "NVIDIA_VISIBLE_DEVICES": uuid_of(i % GPUS)}, ()))


def whole_file(path: Path, claims: dict[str, PreparedClaim]) -> None:
    """What earlier versions wrote at every prepare: every claim, one checksum, renamed."""
    body = {uid: _claim_json(c) for uid, c in sorted(claims.items())}
    text = json.dumps({"version": 1, "claims": body, "checksum": _digest(body)},
                      sort_keys=True, separators=(",", ":"))
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


class WholeFileCheckpoint(Checkpoint):
    """The baseline: every prepare and unprepare rewrites the file of every claim."""

    def __init__(self, path: Path):
        super().__init__(path.parent)
        self.file = path
        self.held: dict[str, PreparedClaim] = {}

    def put(self, claim: PreparedClaim) -> None:
        self.held[claim.uid] = claim
        self.file.parent.mkdir(parents=True, exist_ok=True)
        whole_file(self.file, self.held)

    def drop(self, uid: str) -> None:
        self.held.pop(uid, None)
        whole_file(self.file, self.held)


def bench_checkpoint(root: Path, live: int, rounds: int) -> tuple[list[float], list[float]]:
    held = {c.uid: c for c in map(claim, range(live))}
    cp = Checkpoint(root / "claims")
    for c in held.values():
        cp.put(c)
    one, whole = [], []
    for i in range(live, live + rounds):
        c = claim(i)
        one.append(timed(lambda c=c: cp.put(c)))
        cp.drop(c.uid)
        whole.append(timed(lambda c=c: whole_file(root / "checkpoint.json",
                                                  {**held, c.uid: c})))
    return one, whole


class MemoryClaims:
    """Claims held in memory: the preparer measured without HTTP or gRPC."""

    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Any]] = {}

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return self.claims[name]

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None


def bench_preparer(root: Path, claims: int, live: int, whole: bool) -> list[float]:
    """NodePrepareResources' own work: the preparer called directly (claims in memory)."""
    gpus = FakeGpuBackend(root / "gpus.yaml").discover()
    source = MemoryClaims()
    preparer = Preparer(PrepareConfig(NODE), source, lambda: gpus,
                        Checkpoint(root / f"claims-{whole}"), CdiSpecs(root / f"cdi-{whole}"),
                        Exposure(), NoIsolation())
    if whole:
        preparer.checkpoint = WholeFileCheckpoint(root / f"checkpoint-{whole}.json")
        preparer._follow = lambda claim, added: setattr(  # type: ignore[method-assign]
            preparer, "_cached", None)
    out = []
    for i in range(claims):
        obj = allocated_claim(f"c{i}", [dra.device_name(i % GPUS)], memory="1Gi", cores="5")
        source.claims[f"c{i}"] = obj
        out.append(timed(lambda obj=obj: preparer.prepare(*ref(obj))))  # type: ignore[misc]
        if i >= live:
            preparer.unprepare(f"uid-c{i - live}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=400)
    parser.add_argument("--live", type=int, default=40)
    parser.add_argument("--faults", type=int, default=20)
    parser.add_argument("--layout", choices=["both", "split", "one"], default="both")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each layout and "
                        "checkpoint, in alternating order (default 2)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    print(line("before"))
    layouts = {"split": (run_split, "agent, FAKE API server and FAKE kubelet in three "
                                    "processes (as deployed)"),
               "one": (run_one, "agent + FAKE API server + FAKE kubelet in ONE process "
                                "(one interpreter lock)")}
    kept: dict[tuple[str, bool], Figures] = {}
    for name, (run, what) in layouts.items():
        if args.layout not in (name, "both"):
            continue
        for r in range(args.repeat):  # alternating which checkpoint goes first
            for old in ((True, False) if r % 2 == 0 else (False, True)):
                with tempfile.TemporaryDirectory(prefix="gp-", dir="/tmp") as tmp:
                    write_gpus(Path(tmp) / "gpus.yaml", GPUS, 81920)
                    figures = run(Path(tmp), args, old)
                pooled = kept.setdefault((name, old), {k: [] for k in figures})
                for k, v in figures.items():
                    pooled[k].extend(v)
        for old in (True, False):
            how = "before (whole-file checkpoint, state rebuilt)" if old else "now"
            print_layout(f"DRA plugin, {GPUS} GPUs, {what}, {how}, ~{args.live} claims "
                         f"prepared, {args.repeat} runs pooled:", kept[(name, old)])
    for name in layouts:
        if (name, True) in kept:
            before, now = kept[(name, True)]["prepare"], kept[(name, False)]["prepare"]
            print(f"prepare, {name}: p50 {statistics.median(before):.2f} -> "
                  f"{statistics.median(now):.2f} ms, p99 {pct(before, 99):.2f} -> "
                  f"{pct(now, 99):.2f} ms (before -> now)")
    with tempfile.TemporaryDirectory(prefix="gp-", dir="/tmp") as tmp:
        direct: dict[bool, list[float]] = {True: [], False: []}
        for r in range(args.repeat):
            for old in ((True, False) if r % 2 == 0 else (False, True)):
                where = Path(tmp) / f"{r}-{old}"
                where.mkdir()
                write_gpus(where / "gpus.yaml", GPUS, 81920)
                direct[old].extend(bench_preparer(where, args.claims, args.live, old))
    print(f"The preparer alone (no HTTP, no gRPC; claims in memory), {args.live} claims held:")
    report("before (whole-file checkpoint, state rebuilt)", direct[True])
    report("now", direct[False])
    with tempfile.TemporaryDirectory(prefix="gp-", dir="/tmp") as tmp:
        one, whole = bench_checkpoint(Path(tmp), args.live, args.claims)
    print(f"Checkpoint write of one prepare, {args.live} claims held:")
    report("baseline: whole file of every claim (before)", whole)
    report("one claim file (now)", one)
    print(f"  p50 ratio whole / one: {statistics.median(whole) / statistics.median(one):.1f}x")
    print(line("after"))


if __name__ == "__main__":
    main()
