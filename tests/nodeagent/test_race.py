"""Two pods bound to one node at the same moment each get exactly their decided GPUs.

Each run binds two pods with extender decisions (random shapes: shared slices,
possibly on the same GPU, exclusive whole GPUs, one or two containers) before
kubelet admits either; the FAKE kubelet then admits them one at a time in a
random order — not necessarily creation order — picking random free logical
devices, as a real kubelet may.
"""

from __future__ import annotations

import random
from typing import Any

from gpupool_testing.fake_apiserver import FakeApiServer

from .builders import decision, pod, uuid_of
from .conftest import AgentFactory
from .kubelet_standin import FakeKubelet, runtime_gpus

GPUS = 4
RUNS = 100


def random_pod(name: str, rng: random.Random, exclusive: set[int], shared: set[int],
               created: str) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """A pod with a decision that fits beside the other's; and container -> uuids.

    Exclusive pods take GPUs nobody uses (``exclusive``); shared pods take any GPU
    that is not held exclusively (``shared`` records them).
    """
    idle = [g for g in range(GPUS) if g not in exclusive | shared]
    free = [g for g in range(GPUS) if g not in exclusive]
    if rng.random() < 0.3 and idle:
        count = min(rng.choice([1, 2]), len(idle))
        gpus = rng.sample(idle, count)
        exclusive.update(gpus)
        slices = [(uuid_of(g), g, 16384, 100, "main") for g in gpus]
        p = pod(name, [("main", count, 0, 0)], ann=decision(name, slices, exclusive=True),
                created=created)
        return p, {"main": [uuid_of(g) for g in gpus]}
    containers = ["main"] if rng.random() < 0.6 else ["a", "b"]
    slices, specs, want = [], [], {}
    for c in containers:
        count = rng.choice([1, 1, 2])
        gpus = rng.sample(free, count)
        mem, core = rng.choice([1024, 2048, 4096]), rng.choice([10, 20, 25])
        slices += [(uuid_of(g), g, mem, core, c) for g in gpus]
        specs.append((c, count, mem, core))
        want[c] = [uuid_of(g) for g in gpus]
    shared.update(g for _, g, *_ in slices)
    return pod(name, specs, ann=decision(name, slices), created=created), want


def test_two_pods_bound_at_once_get_their_decided_gpus_in_every_run(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer) -> None:
    make_agent(gpus=GPUS, split=8)
    kubelet.wait_registrations(1)
    kubelet.wait_update(lambda d: len(d) == GPUS * 8)
    rng = random.Random(20260101)
    correct = 0
    for run in range(RUNS):
        exclusive: set[int] = set()
        shared: set[int] = set()
        times = ["2026-01-01T00:00:01Z", "2026-01-01T00:00:02Z"]
        rng.shuffle(times)
        a, want_a = random_pod(f"a{run}", rng, exclusive, shared, times[0])
        b, want_b = random_pod(f"b{run}", rng, exclusive, shared, times[1])
        apiserver.seed("pods", a)
        apiserver.seed("pods", b)
        order = [(a, want_a), (b, want_b)]
        rng.shuffle(order)
        results = [(kubelet.admit(p, rng), want) for p, want in order]
        correct += all(runtime_gpus(got, c) == sorted(uuids)
                       for got, want in results for c, uuids in want.items())
        for p, _ in order:
            kubelet.forget(f"default/{p['metadata']['name']}")
            apiserver.delete("pods", p["metadata"]["name"], "default")
    assert correct == RUNS
