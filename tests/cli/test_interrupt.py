"""Ctrl-C stops ``gpupool simulate`` at once: queued runs cancelled, workers stopped, the
runs that finished written whole (never a half-written file), exit code 130."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpupool.cli import simulate as simulate_cli
from gpupool.cli.main import main
from gpupool.sim.campaign import Campaign, CampaignInterrupted, Progress, Run, run_campaign
from gpupool.sim.synthetic import synthetic_scenario

LONG = ["--policy", "fgd-balance", "--seeds", "1-40", "--workers", "2",
        "--synthetic-nodes", "3000"]
"""Runs of 12 s or more each (one process, 2-core machine; a loaded machine only makes
them longer): a campaign of many minutes."""

HANG_S = 180
"""Only a guard against a campaign that never stops: how promptly it stops is measured by
bench/bench_interrupt.py, not here, so that a busy machine cannot fail this test."""


def children(pid: int) -> set[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return set()
    return {int(p) for p in text.split()}


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc (Linux)")
def test_ctrl_c_stops_a_long_campaign_with_workers_without_waiting_for_its_runs(
        tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "gpupool.cli.main", "simulate", *LONG,
                             "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 90  # the campaign is built first: seconds
        while len(children(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = children(proc.pid)
        assert len(workers) >= 2, "the campaign's workers never started"
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:  # a campaign that did not stop: not left running
            for pid in (*children(proc.pid), proc.pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    # the signal came 0.3 s into runs that each take many seconds (longer still on a busy
    # machine): had stopping waited for the runs in progress, they would have finished and
    # been written; it did not wait, so none finished
    assert stderr.strip().splitlines()[-1].startswith(
        "gpupool simulate: interrupted before any run finished"), stderr
    assert not any(alive(w) for w in workers), "a worker outlived the campaign"
    leftovers = [p.name for p in out.iterdir()] if out.exists() else []
    assert leftovers == [], leftovers  # nothing written, no temporary files


def interrupt_after_first_run(real: object) -> object:
    def run(campaign: Campaign, workers: int, progress: Progress | None = None) -> list[Run]:
        def stop(_pods: int) -> None:
            raise KeyboardInterrupt
        return real(campaign, 2, stop)  # type: ignore[operator]
    return run


def test_an_interrupted_campaign_hands_back_the_runs_that_finished() -> None:
    campaign = Campaign(synthetic_scenario(20), ("random",), (1, 2, 3))
    with pytest.raises(CampaignInterrupted) as caught:
        interrupt_after_first_run(run_campaign)(campaign, 2)  # type: ignore[operator]
    assert len(caught.value.runs) == 1 and caught.value.planned == 3


def test_simulate_writes_what_finished_and_exits_130(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(simulate_cli, "run_campaign", interrupt_after_first_run(run_campaign))
    out = tmp_path / "out"
    code = main(["simulate", "--policy", "random", "--seeds", "1-3", "--synthetic-nodes", "20",
                 "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 130
    assert err == (f"gpupool simulate: interrupted; 1 of 3 runs finished and were written "
                   f"to {out}; the others were cancelled\n")
    assert sorted(p.name for p in out.iterdir()) == ["allocation.png", "curves.csv",
                                                    "summary.json"]


def test_an_interrupted_simulation_is_marked_partial_in_its_summary_and_table(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(simulate_cli, "run_campaign", interrupt_after_first_run(run_campaign))
    out = tmp_path / "out"
    assert main(["simulate", "--policy", "random", "--seeds", "1-3", "--synthetic-nodes", "20",
                 "--out", str(out)]) == 130
    summary = json.loads((out / "summary.json").read_text())
    assert summary["partial"] is True and summary["interrupted"] is True
    [seed] = summary["seeds"]  # the run that finished first: two workers, any of the three
    assert seed in (1, 2, 3)
    assert summary["planned"] == {"policies": ["random"], "seeds": [1, 2, 3], "runs": 3}
    assert [(r["policy"], r["seed"]) for r in summary["runs"]] == [("random", seed)]
    assert summary["policies"]["random"]["runs"] == 1
    shown = capsys.readouterr().out
    assert f"protocol mode, PARTIAL (interrupted): 1 of 3 runs, seeds {seed} of 1-3\n" in shown
    row = next(line for line in shown.splitlines() if line.startswith("│ random"))
    assert row.split("│")[2].strip() == "1 of 3"  # the runs column, only in a partial table


def test_a_whole_simulation_is_not_marked_partial(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["simulate", "--policy", "random", "--seeds", "1-2", "--synthetic-nodes", "20",
                 "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["partial"] is False and summary["interrupted"] is False
    assert summary["seeds"] == [1, 2] and summary["planned"]["runs"] == 2


def test_ctrl_c_before_any_run_finished_writes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    def never(campaign: Campaign, workers: int, progress: Progress | None = None) -> list[Run]:
        raise CampaignInterrupted([], 3)
    monkeypatch.setattr(simulate_cli, "run_campaign", never)
    out = tmp_path / "out"
    assert main(["simulate", "--synthetic-nodes", "5", "--out", str(out)]) == 130
    assert "nothing was written" in capsys.readouterr().err
    assert not out.exists()
