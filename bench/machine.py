"""How fast the machine is right now: a fixed workload that uses no gpupool code.

The development machine's speed drifts by up to 2x from hour to hour (the same code
and command gave a 5,000-node rebuild of 2.3 s one day and 4.9 s another). Figures
from different days are only comparable beside this: the benchmarks print it
before and after their measurements, and ``docs/benchmarks.md`` records it with
each run. It is the kind of work the extender does per pod (decode a JSON list of
5,000 node names, look each up in a dict, numpy masks and gathers over 40,000
GPUs, encode a few hundred small objects), so a round that takes 1.5x longer means
the extender's figures are to be read against a 1.5x slower machine.

That round stays on one core. The extender's figures also hang on how fast the
machine wakes a waiting thread or process (an HTTP call, an API write, a watch
event, a GIL hand-off), which on a virtual machine can vary on its own: the second
figure is the round trip of one byte between two processes over pipes (median of
batches), which a bare-metal Linux machine does in well under 10 µs.

    .venv/bin/python bench/machine.py [--rounds 200]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import msgspec
import numpy as np

ROUNDS = 200
NAMES = 5000
GPUS = 40_000


class Workload:
    """The fixed inputs, made once (seeded): the timed part only reads them."""

    def __init__(self) -> None:
        rng = random.Random(7)
        names = [f"n{i:05d}" for i in range(NAMES)]
        self.index = {name: i for i, name in enumerate(names)}
        self.raw = msgspec.json.encode(rng.sample(names, len(names)))
        gen = np.random.default_rng(7)
        self.free = gen.integers(0, 81920, GPUS)
        self.order = gen.permutation(NAMES)
        self.records = [{"Host": name, "Score": k % 11} for k, name in enumerate(names[:300])]

    def round(self) -> int:
        """One round of work; returns a checksum so that nothing is optimised away."""
        rows = [self.index[name] for name in msgspec.json.decode(self.raw)]
        fits = (self.free >= 20480).reshape(NAMES, -1).any(axis=1)
        picked = np.flatnonzero(fits[self.order])
        scores = np.sort(self.free.reshape(NAMES, -1).sum(axis=1)[picked])
        answer = msgspec.json.encode(self.records)
        return len(rows) + int(scores[-1]) + len(answer)


def machine_ms(rounds: int = ROUNDS) -> float:
    """Median milliseconds of one round of the fixed workload (after two warm rounds)."""
    work = Workload()
    for _ in range(2):
        work.round()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        work.round()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def wakeup_us(trips: int = 500, batches: int = 7) -> float:
    """Median µs of a one-byte round trip between this process and a child, over pipes."""
    to_child, from_parent = os.pipe()
    to_parent, from_child = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child echoes every byte until the parent closes its end
        os.close(from_parent)
        os.close(to_parent)
        while os.read(to_child, 1):
            os.write(from_child, b"x")
        os._exit(0)
    os.close(to_child)
    os.close(from_child)
    medians = []
    try:
        for _ in range(batches):
            t0 = time.perf_counter()
            for _ in range(trips):
                os.write(from_parent, b"x")
                os.read(to_parent, 1)
            medians.append((time.perf_counter() - t0) / trips * 1e6)
    finally:
        os.close(from_parent)
        os.close(to_parent)
        os.waitpid(pid, 0)
    return statistics.median(medians)


def line(when: str, rounds: int = ROUNDS) -> str:
    return (f"machine check ({when}): {machine_ms(rounds):.2f} ms a round of CPU work "
            f"(median of {rounds}), {wakeup_us():.0f} µs a process wake-up round trip "
            "(bench/machine.py, no gpupool code: larger figures mean a slower machine)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    print(line("now", parser.parse_args().rounds))


if __name__ == "__main__":
    main()
