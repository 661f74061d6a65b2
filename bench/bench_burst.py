"""Benchmark: a burst of GPU pods scheduled as kube-scheduler drives the extender.

    .venv/bin/python bench/bench_burst.py [--nodes 500 5000] [--pods 500]
        [--latency-ms 2 5] [--inflight 16] [--qps 0 50] [--before REF]
        [--variants no-op before off after] [--share adaptive|all] [--mix] [--profile DIR]

Every run starts from a fresh cluster on the FAKE API server (a child process; N nodes ×
8 GPUs of 80 GiB; ``--busy`` of the GPU share already held by signed pods with their
GPULedger entries, none by default) holding ``--pods`` pending pods at once (a burst),
each of 8,192 MiB and 30 % of a GPU (the pods of the real control-plane run in
docs/benchmarks.md;
``--mix``: bench_extender's five shapes; ``--quota``: under a TenantQuota, so every
bind also writes the tenant's QuotaLedger). Every request to the fake API server but a
watch waits a uniform draw of ``--latency-ms`` (a real API server answers after etcd
commits).

The extender runs as ``gpupool extender --plain-http`` in a process of its own, and a
kube-scheduler stand-in (this process) schedules the burst with kube-scheduler's
pattern: one scheduling cycle at a time — filter (the adaptive share of nodes
kube-scheduler sends by default, from a rotating start, in a fresh order per pod;
``--share all``: every node), then prioritize (skipped when one node passes, as
kube-scheduler skips it), then the highest-scored node (ties: one at random, as
``selectHost``) — and the bind issued asynchronously right after, up to ``--inflight``
binds in flight, each on a connection of its own. A pod whose bind (or filter) fails goes
back to the queue with kube-scheduler's backoff (1 s, doubling, at most 10 s).
``--qps 50`` also paces the cycles at 50 a second (burst 100), as kube-scheduler's client
rate limit paces it alone; ``--qps 0`` does not pace them.

Variants, each in fresh processes, one after the other (``--rounds``: all of them again,
in the same order, so that old and new alternate):

* ``no-op``: an extender that passes every node, scores none and binds with one Binding:
  what the same harness reaches without gpupool's work (the baseline);
* ``before``: the extender of git revision ``--before`` (its ``src`` tree taken with
  ``git archive``), run as it was;
* ``off``: this tree with assumptions off (``--assume-expiry 0``);
* ``after``: this tree as shipped.

Printed per variant: pods/s (pods bound / time to bind the burst), bind p50 / p99 as the
stand-in waited for them, binds refused (every bind names the node the extender scored
highest, so each refusal is of the extender's own pick) by reason, answers of 503, the
extender's CPU per pod, GPUs over-committed (every bound pod's decision reserved into one
fresh state) and bound pods without a signed decision; then where a bind's time went
(``gpupool_extender_bind_stage_seconds``: mean ms per bind of each stage, when the
revision has that metric), and the ledger conflicts retried.
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any

import httpx
import msgspec
from bench_extender import (
    BIND_ANSWER,
    FILTER_ANSWER,
    GPU_MIB,
    GPUS,
    HOST_PRIORITIES,
    SHAPES,
    ClientPerThread,
    FakeApi,
    LoopbackClient,
    args_body,
    cluster_lines,
    pct,
    pod_obj,
)
from burst_profile import PROFILED
from burst_profile import report as profile_report
from prometheus_client.parser import text_string_to_metric_families

from gpupool.contract.annotations import decode, has_decision
from gpupool.contract.names import ANNOTATION_SIGNATURE
from gpupool.core.errors import OverCommit
from gpupool.core.model import uniform_node
from gpupool.core.state import ClusterState
from gpupool.sim.window import ADAPTIVE, nodes_to_find

from machine import line as machine_line

ROOT = Path(__file__).resolve().parents[1]
ISSUE_SHAPE = {"gpupool.io/gpu-memory": "8192", "gpupool.io/gpu-core": "30"}
VARIANTS = ("no-op", "before", "off", "after")
BACKOFF_S, MAX_BACKOFF_S = 1.0, 10.0  # kube-scheduler's podInitial/MaxBackoffSeconds


# -- the cluster and its burst ---------------------------------------------------------------
def burst_lines(nodes: int, pods: int, busy: float, mix: bool, seed: int, quota: bool
                ) -> tuple[list[str], list[dict[str, Any]]]:
    """The seed (bench_extender's cluster plus ``pods`` pending pods, a burst, and with
    ``quota`` a TenantQuota over their namespace that they never fill), and the burst's
    pods."""
    lines = list(cluster_lines(nodes, int(nodes * GPUS * busy / 0.25), 0, seed))
    if quota:
        lines.append(msgspec.json.encode({"kind": "tenantquotas", "object": {
            "metadata": {"name": "bench"},
            "spec": {"namespaces": ["bench"], "limits": {"gpus": 10**6}}}}).decode())
    rng = random.Random(seed)
    burst = [pod_obj(f"burst-{k}", rng.choice(SHAPES) if mix else ISSUE_SHAPE, f"burst-{k}")
             for k in range(pods)]
    lines += [msgspec.json.encode({"kind": "pods", "object": pod}).decode() for pod in burst]
    return lines, burst


def over_committed(url: str, nodes: int) -> tuple[int, int, int]:
    """(bound pods of the burst, pods whose decision did not fit the GPUs left by those
    before it, bound GPU pods without a signature): every bound pod's decision reserved
    into one fresh state of the cluster's layout."""
    state = ClusterState([uniform_node(f"n{i:05d}", 10**9, 10**9, GPUS, "H100-80GB", GPU_MIB)
                          for i in range(nodes)])
    bound = over = unsigned = 0
    with httpx.Client(base_url=url, trust_env=False, timeout=120) as http:
        pods = http.get("/api/v1/namespaces/bench/pods").json()["items"]
    for pod in pods:
        meta, spec = pod["metadata"], pod["spec"]
        notes = meta.get("annotations") or {}
        if not spec.get("nodeName"):
            continue
        bound += meta["name"].startswith("burst-")
        if not has_decision(notes):
            unsigned += 1
            continue
        unsigned += ANNOTATION_SIGNATURE not in notes
        try:
            state.reserve(decode(meta["uid"], notes).allocation)
        except OverCommit:
            over += 1
    return bound, over, unsigned


# -- the extender processes --------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def source_of(ref: str, into: Path) -> Path:
    """The ``src`` tree of git revision ``ref`` (read with ``git archive``), under ``into``."""
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "src"], check=True,
                         capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(tar)) as archive:
        archive.extractall(into, filter="data")
    return into / "src"


class ExtenderProcess:
    """``gpupool extender`` (or the no-op extender) in a process of its own, ready."""

    def __init__(self, variant: str, api_url: str, src: Path | None, log: Path,
                 profile: Path | None = None):
        self.port, self.probe = free_port(), free_port()
        self.profile = profile
        if variant == "no-op":
            cmd = [sys.executable, __file__, "--noop-extender", api_url, str(self.port)]
        else:
            cmd = [sys.executable, "-c", (PROFILED if profile else "") +
                   "import sys; from gpupool.cli.main import main; sys.exit(main())",
                   "extender", "--server", api_url, "--plain-http",
                   "--host", "127.0.0.1", "--port", str(self.port),
                   "--probe-port", str(self.probe), "--log-level", "warning",
                   *(["--assume-expiry", "0"] if variant == "off" else [])]
        env = dict(os.environ)
        if profile is not None:
            env["GPUPOOL_BENCH_PROFILE"] = str(profile)
        if src is not None:  # an earlier revision's code first on the path
            env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")])
        self.log = log.open("w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        self.probes = f"http://127.0.0.1:{self.port if variant == 'no-op' else self.probe}"
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.flush()
                tail = Path(self.log.name).read_text()[-3000:]
                raise RuntimeError(f"the extender exited ({self.proc.returncode}):\n{tail}")
            try:
                if httpx.get(self.probes + "/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("the extender did not get ready in 600 s")

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def metrics(self) -> dict[str, float]:
        """The bind stages' sums and counts, ledger conflicts and the verbs' time."""
        text = httpx.get(self.probes + "/metrics", timeout=30).text
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                label = sample.labels.get("stage") or sample.labels.get("verb") or ""
                if sample.name.endswith(("_sum", "_count", "_total")):
                    out[f"{sample.name}:{label}"] = sample.value
        return out

    def profiling(self, on: bool) -> None:
        """Start (``on``) or stop yappi in the extender (``--profile``); stopping waits for
        its statistics to be written."""
        if self.profile is None:
            return
        self.profile.unlink(missing_ok=True)
        self.proc.send_signal(signal.SIGUSR1 if on else signal.SIGUSR2)
        deadline = time.monotonic() + 120
        while not on and not self.profile.exists() and time.monotonic() < deadline:
            time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def noop_extender(api_url: str, port: int) -> None:
    """In a child process: filter passes every node, prioritize scores none, bind creates
    the Binding (what kube-scheduler does alone); served by the extender's own HTTP app."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from gpupool.extender.edge.app import ExtenderApp
    from gpupool.extender.edge.server import ThreadedServer
    from gpupool.extender.metrics import Metrics
    from gpupool.kube.api import KubeApi
    from gpupool.kube.errors import KubeError

    kube = KubeApi.connect(server=api_url)

    def filter_(body: bytes | bytearray) -> bytes:
        names = bytes(FILTER_NAMES.decode(body).NodeNames)
        return b'{"NodeNames":' + names + b',"FailedNodes":{},"Error":""}'

    def bind(body: bytes | bytearray) -> bytes:
        args = msgspec.json.decode(body)
        try:
            kube.bind_pod(args["PodNamespace"], args["PodName"], args["PodUID"], args["Node"])
        except KubeError as exc:
            return msgspec.json.encode({"Error": str(exc)})
        return b'{"Error":""}'

    async def ready(_request: Any) -> PlainTextResponse:
        return PlainTextResponse("ready")

    app = ExtenderApp({"filter": filter_, "prioritize": lambda _b: b"[]", "bind": bind},
                      Metrics(), Starlette(routes=[Route("/readyz", ready)]))
    with ThreadedServer(app, port=port):
        threading.Event().wait()  # until the bench terminates this process


class SentNames(msgspec.Struct):
    NodeNames: msgspec.Raw = msgspec.Raw(b"null")


FILTER_NAMES = msgspec.json.Decoder(SentNames)


# -- the kube-scheduler stand-in ----------------------------------------------------------------
@dataclass
class Outcome:
    """What one run of the burst gave."""

    wall_s: float = 0.0
    bound: int = 0
    binds: list[float] = field(default_factory=list)  # seconds per bind call
    cycles: list[float] = field(default_factory=list)  # filter + prioritize, seconds
    refused: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)  # the first refusal of each kind
    unschedulable: int = 0
    http_503: int = 0


class StandIn:
    """kube-scheduler's pattern against one extender: cycles one at a time, binds in
    flight, failed pods back with backoff (the module's docstring)."""

    def __init__(self, url: str, names: list[str], pods: list[dict[str, Any]],
                 opts: Options, rng: random.Random):
        self.url, self.names, self.opts, self.rng = url, names, opts, rng
        self.window = len(names) if opts.share == "all" else nodes_to_find(len(names),
                                                                           ADAPTIVE)
        self.start_at = 0
        self.queue: list[tuple[float, int, int]] = [(0.0, k, 0) for k in range(len(pods))]
        self.bodies = [msgspec.json.encode(p) for p in pods]
        self.meta = [(p["metadata"]["name"], p["metadata"]["uid"]) for p in pods]
        self.done = threading.Condition()
        self.inflight = 0
        self.outcome = Outcome()
        self.tokens, self.refilled = 100.0, 0.0  # kube-scheduler's client: qps, burst 100

    def run(self) -> Outcome:
        client, binds = LoopbackClient(self.url), ClientPerThread(self.url)
        started = time.perf_counter()
        self.refilled = started
        deadline = started + self.opts.timeout_s
        with ThreadPoolExecutor(self.opts.inflight) as pool:
            while time.perf_counter() < deadline:
                item = self._next(deadline)
                if item is None:
                    break
                self._cycle(client, binds, pool, *item)
        self.outcome.wall_s = time.perf_counter() - started
        client.close()
        binds.close()
        return self.outcome

    def _next(self, deadline: float) -> tuple[int, int] | None:
        """The next pod whose backoff is over (None: every pod bound, or the time is up)."""
        with self.done:
            while True:
                if self.outcome.bound == len(self.bodies) or time.perf_counter() > deadline:
                    return None
                now = time.perf_counter()
                if self.queue and self.queue[0][0] <= now:
                    _, k, tries = heapq.heappop(self.queue)
                    return k, tries
                wait = self.queue[0][0] - now if self.queue else 1.0
                self.done.wait(min(wait, 1.0))

    def _cycle(self, client: LoopbackClient, binds: ClientPerThread,
               pool: ThreadPoolExecutor, k: int, tries: int) -> None:
        self._pace()
        t0 = time.perf_counter()
        try:
            node = self._pick(client, k)
        except RuntimeError:  # a 503: the cycle fails, the pod waits its backoff
            self.outcome.http_503 += 1
            node = None
        self.outcome.cycles.append(time.perf_counter() - t0)
        if node is None:
            self.outcome.unschedulable += 1
            self._back(k, tries)
            return
        with self.done:
            while self.inflight >= self.opts.inflight:
                self.done.wait()
            self.inflight += 1
        future = pool.submit(self._bind, binds, k, node)
        future.add_done_callback(lambda f: self._bound(f, k, tries))

    def _pace(self) -> None:
        if not self.opts.qps:
            return
        while True:
            now = time.perf_counter()
            self.tokens = min(100.0, self.tokens + (now - self.refilled) * self.opts.qps)
            self.refilled = now
            if self.tokens >= 1:
                self.tokens -= 1
                return
            time.sleep((1 - self.tokens) / self.opts.qps)

    def _pick(self, client: LoopbackClient, k: int) -> str | None:
        count = len(self.names)
        sent = (self.names * 2)[self.start_at:self.start_at + self.window]
        self.start_at = (self.start_at + self.window) % count
        sent = self.rng.sample(sent, len(sent))
        pod = self.bodies[k]
        passing = FILTER_ANSWER.decode(client("filter", args_body(pod, msgspec.json.encode(
            sent))))
        names = bytes(passing.NodeNames)
        if passing.Error or names in (b"null", b"[]"):
            return None
        listed: list[str] = msgspec.json.decode(names)
        if len(listed) == 1:
            return listed[0]  # kube-scheduler does not prioritize a single node
        hosts = HOST_PRIORITIES.decode(client("prioritize", args_body(pod, names)))
        scores = {h.Host: h.Score for h in hosts}
        best = max(scores.values(), default=0)
        return self.rng.choice([n for n in listed if scores.get(n, 0) == best])

    def _bind(self, binds: ClientPerThread, k: int, node: str) -> str:
        name, uid = self.meta[k]
        body = msgspec.json.encode({"PodName": name, "PodNamespace": "bench", "PodUID": uid,
                                    "Node": node})
        t0 = time.perf_counter()
        try:
            error = BIND_ANSWER.decode(binds("bind", body)).Error
        except RuntimeError as exc:
            error = f"HTTP {exc}"
        self.outcome.binds.append(time.perf_counter() - t0)
        return error

    def _bound(self, future: Future[str], k: int, tries: int) -> None:
        error = future.result()
        with self.done:
            self.inflight -= 1
            if error:
                self.outcome.refused[refusal_kind(error)] += 1
                self.outcome.examples.setdefault(refusal_kind(error), error)
                self._back(k, tries, locked=True)
            else:
                self.outcome.bound += 1
            self.done.notify_all()

    def _back(self, k: int, tries: int, locked: bool = False) -> None:
        ready = time.perf_counter() + min(MAX_BACKOFF_S, BACKOFF_S * 2 ** tries)
        if locked:
            heapq.heappush(self.queue, (ready, k, tries + 1))
            return
        with self.done:
            heapq.heappush(self.queue, (ready, k, tries + 1))


def refusal_kind(error: str) -> str:
    if error.startswith("HTTP") and "503" in error:
        return "503"
    if "kept changing" in error:
        return "kept changing"
    if "have room" in error or "does not fit" in error or "could not reserve" in error:
        return "no room"
    return "other"


# -- a run -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Options:
    pods: int
    busy: float
    latency_ms: tuple[float, float]
    inflight: int
    share: str
    mix: bool
    seed: int
    timeout_s: float
    quota: bool = False
    qps: float = 0.0


def run_variant(variant: str, nodes: int, opts: Options, src: Path | None, logs: Path,
                profile: Path | None = None) -> dict[str, Any]:
    """One run of the burst; with ``profile``, the extender is profiled during the burst
    and its statistics written there."""
    lines, pods = burst_lines(nodes, opts.pods, opts.busy, opts.mix, opts.seed, opts.quota)
    api = FakeApi(iter(lines), ("--latency-ms", *map(str, opts.latency_ms)))
    ext = None
    try:
        ext = ExtenderProcess(variant, api.url, src, logs / f"{variant}-{nodes}.log", profile)
        names = [f"n{i:05d}" for i in range(nodes)]
        before = ext.metrics() if variant != "no-op" else {}
        ext.profiling(True)
        cpu = ext.cpu_s()
        outcome = StandIn(ext.url, names, pods, opts, random.Random(opts.seed)).run()
        cpu = ext.cpu_s() - cpu
        ext.profiling(False)
        after = ext.metrics() if variant != "no-op" else {}
        bound, over, unsigned = over_committed(api.url, nodes)
    finally:
        if ext is not None:
            ext.stop()
        api.close()
    return {"outcome": outcome, "cpu_ms": cpu * 1e3 / max(1, outcome.bound),
            "api_bound": bound, "over": over, "unsigned": unsigned,
            "metrics": {k: v - before.get(k, 0.0) for k, v in after.items()}}


def report(nodes: int, opts: Options, rows: list[tuple[str, dict[str, Any]]]) -> None:
    share = "every node" if opts.share == "all" else \
        f"{nodes_to_find(nodes, ADAPTIVE)} nodes a cycle"
    pace = f"paced at {opts.qps:g} cycles/s" if opts.qps else "unpaced"
    quota = ", under a TenantQuota" if opts.quota else ""
    print(f"\n{nodes} nodes × {GPUS} GPUs, {opts.pods} pods{quota}, {share}, API "
          f"{opts.latency_ms[0]:g}-{opts.latency_ms[1]:g} ms, {opts.inflight} binds in flight, "
          f"{pace}")
    print(f"{'variant':8} {'pods/s':>7} {'bound':>6} {'bind p50/p99 ms':>16} "
          f"{'cycle p50 ms':>12} {'refused (no room/changing/503/other)':>37} "
          f"{'503s':>5} {'CPU ms':>7} {'over':>5} {'unsigned':>8}")
    base = None
    for variant, r in rows:
        o: Outcome = r["outcome"]
        rate = o.bound / o.wall_s if o.wall_s else 0.0
        base = rate if variant.startswith("no-op") else base
        refused = "/".join(str(o.refused[k]) for k in ("no room", "kept changing", "503",
                                                       "other"))
        binds = f"{pct(o.binds, 0.5) * 1e3:.1f}/{pct(o.binds, 0.99) * 1e3:.1f}" \
            if o.binds else "-"
        cycle = f"{pct(o.cycles, 0.5) * 1e3:.2f}" if o.cycles else "-"
        print(f"{variant:8} {rate:7.1f} {o.bound:6d} {binds:>16} {cycle:>12} {refused:>37} "
              f"{o.http_503 + o.refused['503']:5d} {r['cpu_ms']:7.2f} {r['over']:5d} "
              f"{r['unsigned']:8d}" + (f"   ×{rate / base:.2f} of no-op" if base else ""))
    for variant, r in rows:
        for kind, error in sorted(r["outcome"].examples.items()):
            print(f"{variant}: first refusal counted as {kind}: {error[:300]}")
    for variant, r in rows:
        m = r["metrics"]
        count = m.get("gpupool_extender_bind_stage_seconds_count:parse", 0.0)
        if not count:
            continue
        stages = [(k.split(":", 1)[1], v * 1e3 / count) for k, v in m.items()
                  if k.startswith("gpupool_extender_bind_stage_seconds_sum:")]
        verb = m.get("gpupool_extender_request_seconds_sum:bind", 0.0) * 1e3 / count
        conflicts = m.get("gpupool_extender_ledger_conflicts_total:", 0.0)
        print(f"{variant}: a bind's {verb:.2f} ms (mean over {count:.0f}, from arrival to "
              f"answer): " + ", ".join(f"{s} {ms:.2f}" for s, ms in stages) +
              f"; ledger conflicts retried {conflicts:.0f}")


def profiled(into: Path, nodes: int, opts: Options, rows: list[tuple[str, dict[str, Any]]],
             src: Path | None, logs: Path) -> None:
    """Each extender variant once more, under the profiler, its CPU split by stage and
    scaled to the CPU per pod of the run above (``burst_profile``)."""
    into.mkdir(parents=True, exist_ok=True)
    for variant, r in rows:
        name = variant.split("/")[0]
        if name == "no-op":
            continue
        path = into / f"{variant.replace('/', '-')}-{nodes}-{opts.qps:g}.pstat"
        run_variant(name, nodes, opts, src if name == "before" else None, logs, path)
        profile_report(path, r["cpu_ms"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[500, 5000])
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--busy", type=float, default=0.0,
                        help="share of the GPUs held before the burst (default 0: empty "
                        "nodes, as in the control-plane run)")
    parser.add_argument("--latency-ms", type=float, nargs=2, default=(2.0, 5.0),
                        metavar=("LOW", "HIGH"))
    parser.add_argument("--inflight", type=int, default=16)
    parser.add_argument("--qps", type=float, nargs="+", default=[0.0, 50.0],
                        help="cycles a second (0: unpaced), each a run of every variant")
    parser.add_argument("--share", choices=("adaptive", "all"), default="adaptive")
    parser.add_argument("--mix", action="store_true", help="bench_extender's five shapes")
    parser.add_argument("--quota", action="store_true",
                        help="a TenantQuota over the pods' namespace (each bind also writes "
                        "its QuotaLedger)")
    parser.add_argument("--before", metavar="REF", help="git revision of the 'before' variant")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--rounds", type=int, default=1,
                        help="every variant this many times, in turn (the machine's speed "
                        "drifts: compare rounds side by side)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds a run may take (default 300)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="profile the extender variants during the burst with yappi (CPU "
                        "time, every thread; not a dependency: pip install yappi), write "
                        "DIR/VARIANT-NODES-QPS.pstat and print where the CPU went by stage; "
                        "the CPU figures of such runs include yappi's own cost")
    parser.add_argument("--noop-extender", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.noop_extender:
        noop_extender(args.noop_extender[0], int(args.noop_extender[1]))
        return
    variants = [v for v in args.variants if v != "before" or args.before]
    print(machine_line("before"))
    with tempfile.TemporaryDirectory() as tmp:
        src = source_of(args.before, Path(tmp)) if args.before else None
        logs = Path(tmp) / "logs"
        logs.mkdir()
        for nodes in args.nodes:
            for qps in args.qps:
                opts = Options(args.pods, args.busy, tuple(args.latency_ms), args.inflight,
                               args.share, args.mix, args.seed, args.timeout, args.quota, qps)
                rows = [(f"{v}{'/' + str(r + 1) if args.rounds > 1 else ''}",
                         run_variant(v, nodes, opts, src if v == "before" else None, logs))
                        for r in range(args.rounds) for v in variants]
                report(nodes, opts, rows)
                if args.profile is not None:
                    profiled(args.profile, nodes, opts, rows, src, logs)
    print("\n" + machine_line("after"))


if __name__ == "__main__":
    main()
