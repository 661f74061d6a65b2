"""Gangs in the simulator: placed whole against pod by pod, bursts, and the generated mix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpupool.cli.main import main
from gpupool.core.allocation import Allocation, Slice
from gpupool.core.model import uniform_node
from gpupool.core.policies import make_policy
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.request import GpuDemand, Mode, PodRequest
from gpupool.core.state import ClusterState
from gpupool.sim.bursts import BurstBook
from gpupool.sim.gangload import GangMix, Job, generate
from gpupool.sim.gangs import Mode as Replay
from gpupool.sim.gangs import replay

BEST_FIT = make_policy("best-fit", PolicyConfig())


def job(name: str, at: float, duration: float, members: int, gpus: int = 1) -> Job:
    demand = GpuDemand(gpus, mode=Mode.EXCLUSIVE)
    return Job(name, at, duration, tuple(PodRequest(f"{name}-{i}", 100, 100, (demand,))
                                         for i in range(members)))


def four_gpus() -> ClusterState:
    return ClusterState([uniform_node("n", 8000, 65536, 4, "A100", 16384)])


JOBS = (job("single", 0, 100, 1, gpus=2), job("gang", 1, 50, 3))


def test_a_gang_placed_whole_waits_whole_and_holds_nothing_meanwhile() -> None:
    run = replay(four_gpus(), JOBS, Replay.GANG, BEST_FIT, "best-fit", 1)
    assert (run.started, run.partial_gangs, run.partial_gpu_hours) == (2, 0, 0.0)
    assert run.gang_wait_median_s == 99.0  # from 1 until the single pod leaves at 100
    assert run.unallocated_waiting_pct == 50.0 == run.idle_waiting_pct


def test_a_gang_placed_pod_by_pod_holds_gpus_that_do_nothing_until_its_last_member() -> None:
    run = replay(four_gpus(), JOBS, Replay.PER_POD, BEST_FIT, "best-fit", 1)
    assert (run.started, run.partial_gangs) == (2, 1)
    assert run.partial_gpu_hours == round(2 * 99 / 3600, 3)  # 2 GPUs held for 99 s
    assert run.gang_wait_median_s == 99.0
    assert run.unallocated_waiting_pct == 0.0 and run.idle_waiting_pct == 50.0


def test_partial_gangs_that_wait_on_each_other_never_start_pod_by_pod() -> None:
    two_nodes = ClusterState([uniform_node(n, 8000, 65536, 2, "A100", 16384)
                              for n in ("n1", "n2")])
    jobs = (job("holder", 0, 10, 1), job("a", 1, 10, 2, gpus=2), job("b", 2, 10, 3))
    # pod by pod: a's first member takes n2 whole, b's first the GPU left on n1; when the
    # holder leaves, a's second member (two GPUs of one node) does not fit, b's second
    # does: a waits for n1, b for a GPU of n2, for ever
    per_pod = replay(two_nodes, jobs, Replay.PER_POD, BEST_FIT, "best-fit", 1,
                     horizon_s=1000)
    assert (per_pod.never_started, per_pod.gangs_never_started) == (2, 2)
    assert per_pod.partial_gpu_hours == round((2 * 1001 + 1 * 1000 + 1 * 992) / 3600, 3)
    assert per_pod.partial_held_pct == 25.0  # over the arrivals: 2 of 4 GPUs from 1 to 2
    gang = replay(two_nodes, jobs, Replay.GANG, BEST_FIT, "best-fit", 1, horizon_s=1000)
    assert (gang.never_started, gang.partial_gangs) == (0, 0)  # b runs, then a


def burst_alloc(key: str, mib: int, burst: int = 0) -> Allocation:
    return Allocation(key, "n", 0, 0, (Slice("GPU-n-0", 0, mib, 10, "c", burst, 0),))


def test_a_burst_is_granted_while_the_gpu_has_room_and_reclaimed_most_recent_first() -> None:
    book = BurstBook(four_gpus())
    book.placed(burst_alloc("early", 4096, 4096), 0)
    book.placed(burst_alloc("late", 4096, 4096), 1)
    assert (book.granted, book.refused, book.reclaimed) == (2, 0, 0)  # 8 + 8 GiB of 16
    book.placed(burst_alloc("plain", 2048), 2)  # 18 GiB needed: one burst goes
    assert book.reclaimed == 1
    book.placed(burst_alloc("refused", 2048, 8192), 3)  # no room at its limit
    assert (book.granted, book.refused) == (2, 1)
    book.released("plain")
    book.placed(burst_alloc("more", 4096), 4)  # 8 + 4 + 2 + 4 = 18: early goes too
    assert book.reclaimed == 2


def test_the_generated_mix_is_seeded_and_within_its_bounds() -> None:
    mix = GangMix(jobs=300)
    jobs = generate(mix, 100, seed=5)
    assert jobs == generate(mix, 100, seed=5) and jobs != generate(mix, 100, seed=6)
    assert all(2 <= len(j.members) <= 64 for j in jobs if j.is_gang)
    assert [j.arrival_s for j in jobs] == sorted(j.arrival_s for j in jobs)
    assert any(d.bursts for j in jobs for m in j.members for d in m.gpus)
    heavier = generate(GangMix(jobs=300, load=2.2), 100, seed=5)
    assert heavier[-1].arrival_s == pytest.approx(jobs[-1].arrival_s / 2)


def test_simulate_gangs_writes_every_run_and_refuses_a_workload_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = main(["simulate", "--gangs", "60", "--synthetic-nodes", "20", "--seeds", "3",
                 "--policy", "best-fit", "--out", str(out)])
    assert code == 0
    runs = json.loads((out / "gangs.json").read_text())
    assert [(r["policy"], r["mode"]) for r in runs] == [("best-fit", "gang"),
                                                       ("best-fit", "per-pod")]
    assert all(r["jobs"] == 60 for r in runs) and runs[0]["partial_gangs"] == 0
    assert "per-pod" in capsys.readouterr().out
    assert main(["simulate", "--gangs", "60", "--pods", "x.csv", "--out", str(out)]) == 2
    assert "--gangs generates its own workload" in capsys.readouterr().err
