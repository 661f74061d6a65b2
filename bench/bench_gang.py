"""Benchmark: the core placing a 64-member gang whole against placing one plain pod.

    .venv/bin/python bench/bench_gang.py [--nodes 5000] [--members 64] [--reps 5]
        [--policy fgd-balance best-fit]

One cluster of ``--nodes`` nodes × 8 GPUs of 80 GiB (zones of 50 nodes, label
``topology.kubernetes.io/zone``), a seeded half of its GPU share already held by pods of
the five shapes of bench_extender's mix, then in the same run, per policy:

* **plain pod**: ``Placer.decide`` for one pod of the gang's member shape on the live
  state (the extender's path: its feasibility memo warm, one node changed since the
  previous decision), median over 50 calls;
* **gang**: ``core.gang.place_gang`` for ``--members`` members — slices of 8 GiB and 30 %
  of a GPU (``shared``), whole GPUs (``whole``), and slices kept in one zone (``zone``) —
  median over ``--reps`` calls (each places on its own scratch copy of the state).

Printed: milliseconds per call, per gang member, and the ratio gang member / plain pod.
CPU time of this one thread (``time.process_time``), so other load on the machine
matters less than wall time would; the machine line (bench/machine.py) before and after.

``--extender NODES`` also measures the scheduler extender (the FAKE API server in a child
process, seeded as bench_extender.py seeds it: NODES nodes × 8 GPUs of 80 GiB, about 30 %
of the GPU share in use; the extender wired as ``gpupool extender`` wires one). In
alternating rounds of the same run it schedules, as kube-scheduler does (filter, then
prioritize when more than one node passes, then bind; every node name sent, shuffled per
pod), ``--members`` plain pods and then one labelled gang of ``--members`` members
(``gpupool.io/gang``), of the same shape: a slice of 8 GiB and 30 % (``shared``) or a
whole GPU (``whole``). Printed per shape: the extender process's CPU per pod (every
thread: the verbs, the binds, the watches taking in their events; the API server's CPU is
its own process's), median over ``--rounds`` rounds, for plain pods and gang members, and
their ratio; and the wall time of the gang's first filter, which places the gang with the
core (under the cache lock) and writes its holds and claim, against a member's other
filters (its slices held: answered from the cache).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import msgspec

from gpupool.contract.names import ANNOTATION_GANG_MIN_COUNT, LABEL_GANG
from gpupool.core.gang import Gang, Together, place_gang
from gpupool.core.model import uniform_node
from gpupool.core.placement import Placer
from gpupool.core.policies import DEFAULT_POLICY, make_policy
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.policies.observed import BUILTIN_WORKLOAD
from gpupool.core.request import GpuDemand, Mode, PodRequest
from gpupool.core.serving import ZONE_LABEL
from gpupool.core.state import ClusterState
from gpupool.extender.state.feeds import start_feeds
from gpupool.kube.api import KubeApi

from machine import line as machine_line

MIX = [(1, 8192, 30), (1, 16384, 50), (1, 40960, 100), (2, 0, 0), (1, 4096, 10)]
SHAPES = {
    "shared": GpuDemand(1, 8192, 30, Mode.SHARED),
    "whole": GpuDemand(1, mode=Mode.EXCLUSIVE),
    "zone": GpuDemand(1, 8192, 30, Mode.SHARED),
}


def busy_cluster(nodes: int, seed: int = 1) -> ClusterState:
    zones = max(nodes // 50, 1)  # 50 nodes a zone
    state = ClusterState([uniform_node(f"node-{i:05d}", 96000, 1024 * 1024, 8, "A100-80GB",
                                       81920, {ZONE_LABEL: f"zone-{i % zones:03d}"})
                          for i in range(nodes)])
    placer, rng = Placer(make_policy("best-fit", PolicyConfig())), random.Random(seed)
    target, k = nodes * 8 * 500, 0  # half the GPU share, in milli-GPU
    while state.usage().allocated_milli < target:
        count, mib, pct = MIX[rng.randrange(len(MIX))]
        demand = GpuDemand(count, mode=Mode.EXCLUSIVE) if not mib else \
            GpuDemand(count, mib, pct, Mode.SHARED)
        for _ in range(200):
            found = placer.decide(state, PodRequest(f"busy-{k}", 1000, 4096, (demand,)), rng)
            k += 1
            if found.allocation is not None:
                state.reserve(found.allocation)
    return state


def plain_ms(placer: Placer, state: ClusterState, pod: PodRequest, rng: random.Random,
             reps: int) -> float:
    """One plain pod's decision, the state having moved by one pod since the previous one
    (each decision is reserved and released again, untimed)."""
    times = []
    for _ in range(reps):
        start = time.process_time()
        found = placer.decide(state, pod, rng)
        times.append((time.process_time() - start) * 1000)
        assert found.allocation is not None
        state.reserve(found.allocation)
        state.release(pod.key)
    return statistics.median(times)


def cpu_ms(call: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.process_time()
        call()
        times.append((time.process_time() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--members", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--policy", nargs="+", default=["fgd-balance", "best-fit"])
    ap.add_argument("--extender", type=int, default=0, metavar="NODES",
                    help="also the extender's CPU per gang member against a plain pod, on "
                         "a cluster of NODES nodes (0: not measured)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(machine_line("before"))
    state = busy_cluster(args.nodes)
    print(f"{args.nodes} nodes × 8 GPUs, {state.usage().allocation_ratio:.0%} of the GPU share "
          f"held by {len(state.allocations)} pods; gangs of {args.members} members")
    print(f"{'policy':<12} {'shape':<7} {'plain pod ms':>12} {'gang ms':>9} "
          f"{'per member ms':>13} {'member/plain':>12}")
    for name in args.policy:
        policy = make_policy(name, PolicyConfig(workload=BUILTIN_WORKLOAD))
        placer, rng = Placer(policy), random.Random(0)
        for shape, demand in SHAPES.items():
            pod = PodRequest("plain", 1000, 4096, (demand,))
            placer.decide(state, pod, rng)  # warm its memo, as a running extender's is
            plain = plain_ms(placer, state, pod, rng, 50)
            members = tuple(PodRequest(f"w{i}", 1000, 4096, (demand,))
                            for i in range(args.members))
            gang = Gang("bench", members, together=Together.DOMAIN if shape == "zone"
                        else Together.ANYWHERE)
            placed = place_gang(state, gang, policy, rng)
            assert placed.ok, placed.summary()
            whole = cpu_ms(lambda g=gang, p=policy, r=rng: place_gang(state, g, p, r),
                           args.reps)
            per = whole / args.members
            print(f"{name:<12} {shape:<7} {plain:>12.2f} {whole:>9.1f} {per:>13.2f} "
                  f"{per / plain:>12.2f}")
    if args.extender:
        extender_rounds(args.extender, args.members, args.rounds)
    print(machine_line("after"))


# -- the extender: gang members against plain pods ------------------------------------------
EXTENDER_SHAPES = {"shared": {"gpupool.io/gpu-memory": "8192", "gpupool.io/gpu-core": "30"},
                   "whole": {"gpupool.io/gpu": "1"}}


def extender_rounds(nodes: int, members: int, rounds: int) -> None:
    """Plain pods and gang members through one extender, alternating (see the module)."""
    from bench_extender import (
        GPUS,
        FakeApi,
        PodCall,
        cluster_lines,
        in_process,
        pod_obj,
        schedule_one,
        wired,
    )
    api = FakeApi(cluster_lines(nodes, int(nodes * GPUS * 0.3 / 0.25), 0, 1))
    kube = KubeApi.connect(server=api.url)
    ext = wired(kube, DEFAULT_POLICY, 1)
    feeds = start_feeds(kube, ext.cache, watch_timeout_s=30)
    ext.refresh_policy()
    ext.warm()
    call, rng = in_process(ext), random.Random(1)
    names = sorted(ext.cache.state.index)

    def pods(tag: str, shape: dict[str, str], gang: bool) -> list[PodCall]:
        made = []
        for k in range(members):
            pod = pod_obj(f"{tag}-{k}", shape)
            if gang:
                pod["metadata"]["labels"] = {LABEL_GANG: tag}
                pod["metadata"]["annotations"] = {ANNOTATION_GANG_MIN_COUNT: str(members)}
            pod = api.create_pod(pod)
            made.append(PodCall(pod["metadata"]["name"], pod["metadata"]["uid"],
                                msgspec.json.encode(pod),
                                msgspec.json.encode(rng.sample(names, len(names)))))
        seen = {p.uid for p in made}
        while not seen <= ext.cache.unbound.keys():  # the informer has them all (untimed)
            time.sleep(0.01)
        return made

    def timed(batch: list[PodCall]) -> tuple[float, list[float]]:
        filters: list[float] = []

        def traced(verb: str, body: bytes) -> bytes:
            t0 = time.perf_counter()
            try:
                return call(verb, body)
            finally:
                if verb == "filter":
                    filters.append((time.perf_counter() - t0) * 1e3)
        start = time.process_time()
        bound = sum(schedule_one(traced, pod)[0] for pod in batch)
        assert bound == len(batch), f"{bound} of {len(batch)} bound"
        return (time.process_time() - start) * 1e3 / len(batch), filters

    print(f"extender: {nodes} nodes × {GPUS} GPUs, {len(ext.cache.state.allocations)} pods "
          f"placed; {members} plain pods, then a gang of {members}, {rounds} rounds")
    print(f"{'shape':<7} {'plain CPU ms/pod':>16} {'member CPU ms/pod':>17} {'ratio':>6} "
          f"{'1st filter ms':>13} {'other filters ms':>16}")
    try:
        for shape, limits in EXTENDER_SHAPES.items():
            plain, member, first, rest = [], [], [], []
            schedule_one(call, pods(f"warm-{shape}", limits, False)[0])
            for r in range(rounds):
                plain.append(timed(pods(f"plain-{shape}-{r}", limits, False))[0])
                cpu, filters = timed(pods(f"gang-{shape}-{r}", limits, True))
                member.append(cpu)
                first.append(filters[0])
                rest += filters[1:]
            p, m = statistics.median(plain), statistics.median(member)
            print(f"{shape:<7} {p:>16.2f} {m:>17.2f} {m / p:>6.2f} "
                  f"{statistics.median(first):>13.1f} {statistics.median(rest):>16.2f}")
    finally:
        ext.close()
        feeds.stop(timeout_s=0.0)
        kube.close()
        api.close()


if __name__ == "__main__":
    main()
