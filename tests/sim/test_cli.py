"""``gpupool simulate`` end to end: outputs written, bad input refused in one line."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from gpupool.cli.main import main
from gpupool.cli.simulate import seeds
from tests.sim.paths import DATA

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_built_in_default_writes_summary_curves_and_plot(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    out = tmp_path / "out"
    code = main(["simulate", "--seeds", "7", "--synthetic-nodes", "40", "--out", str(out),
                 "--policy", "fgd", "--policy", "best-fit", "--workers", "1"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"] == "protocol" and summary["nodes"] == 40
    assert [(r["policy"], r["seed"]) for r in summary["runs"]] == [("fgd", 7), ("best-fit", 7)]
    for run in summary["runs"]:
        assert 0.0 <= run["unallocated_gpu_pct"] <= 100.0
        assert set(run["failures_by_reason"]) == {"gpu", "cpu-memory"}
    for policy in ("fgd", "best-fit"):
        stats = summary["policies"][policy]
        run = next(r for r in summary["runs"] if r["policy"] == policy)
        assert stats["mean_unallocated_gpu_pct"] == pytest.approx(run["unallocated_gpu_pct"],
                                                                  abs=1e-4)
        assert stats["std_unallocated_gpu_pct"] == 0.0
    with (out / "curves.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["policy", "seed", "arrived_demand_pct", "allocated_gpu_pct"]
    assert {r["policy"] for r in rows} == {"fgd", "best-fit"}
    assert max(float(r["arrived_demand_pct"]) for r in rows) >= 129.5
    assert (out / "allocation.png").read_bytes()[:8] == PNG_MAGIC
    shown = capsys.readouterr().out
    assert "unallocated GPU %" in shown and "best-fit" in shown


def test_trace_files_and_timed_mode(tmp_path: Path) -> None:
    code = main(["simulate", "--nodes", str(DATA / "timed_cluster.yaml"),
                 "--pods", str(DATA / "timed_pods.yaml"), "--mode", "timed",
                 "--policy", "best-fit", "--seeds", "1,2", "--out", str(tmp_path)])
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["mode"] == "timed"
    assert [r["failed_pods"] for r in summary["runs"]] == [2, 2]
    assert all(r["unallocated_gpu_pct"] is None for r in summary["runs"])
    assert "time_s" in (tmp_path / "curves.csv").read_text().splitlines()[0]


def test_a_kube_scheduler_window_is_named_and_its_bounced_pods_counted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--seeds", "3", "--synthetic-nodes", "300", "--out", str(tmp_path),
                 "--policy", "best-fit", "--workers", "1", "--nodes-to-score", "0"])
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["nodes_to_score"] == 0
    run = summary["runs"][0]
    assert run["nodes_to_score"] == 0
    assert summary["policies"]["best-fit"]["mean_bounced_pods"] == run["bounced_pods"]
    shown = capsys.readouterr().out
    assert "kube-scheduler window 144 nodes" in shown  # 50 - 300/125 = 48 % of 300
    assert "bounced" in shown


def test_csv_trace_runs_the_protocol(tmp_path: Path) -> None:
    code = main(["simulate", "--nodes", str(DATA / "one_gpu_nodes.csv"),
                 "--pods", str(DATA / "two_shares_pods.csv"), "--inflate", "1.0",
                 "--policy", "fgd", "--seeds", "1-3", "--out", str(tmp_path)])
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["policies"]["fgd"]["mean_unallocated_gpu_pct"] == pytest.approx(40.0)
    assert len(summary["runs"]) == 3


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--policy", "no-such"], "--policy no-such: no such policy"),
        (["--nodes", "/absent/nodes.csv", "--pods", "/absent/pods.csv"], "no such file"),
        (["--nodes", str(DATA / "one_gpu_nodes.csv")], "--nodes and --pods go together"),
        (["--nodes", str(DATA), "--pods", str(DATA)], "is a folder"),
        (["--seeds", "9-3"], "bad seed range"),
        (["--seeds", "x"], "bad seed list"),
        (["--inflate", "0.5"], "--inflate: expected a number from 1 to 10, got 0.5"),
        (["--mode", "sideways"], "invalid choice"),
        (["--workers", "0"], "--workers: expected a whole number of at least 1, got 0"),
        (["--weight", "lambda"], "--weight takes NAME=NUMBER"),
        (["--nodes-to-score", "101"],
         "--nodes-to-score: expected a whole number from 0 to 100, got 101"),
        (["--frobnicate"], "unrecognized arguments: --frobnicate"),
        (["--mix", "no-such-mix"], "no mix named 'no-such-mix'"),
        (["--mix", "base", "--nodes", str(DATA / "one_gpu_nodes.csv")],
         "--mix generates its own cluster and workload"),
        (["--learn", "--learn-every", "0"], "--learn-every: expected a number"),
    ],
)
def test_bad_input_is_one_line_on_stderr_and_exit_code_2(
        argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(["simulate", "--out", str(tmp_path / "never"), *argv])
    except SystemExit as exc:  # argparse's own exit
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "never").exists()


def test_a_file_of_unknown_format_is_refused(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    odd = tmp_path / "cluster.json"
    odd.write_text("{}")
    code = main(["simulate", "--nodes", str(odd), "--pods", str(odd), "--out", str(tmp_path)])
    assert code == 2
    assert "unknown format" in capsys.readouterr().err


def test_seed_lists_and_ranges() -> None:
    assert seeds("42-44") == (42, 43, 44)
    assert seeds("5,1,5,2-3") == (5, 1, 2, 3)


def test_a_generated_mix_learned_online_is_run_and_recorded(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mixes = tmp_path / "mixes.yaml"
    mixes.write_text("mixes:\n  - {name: small, constrained: 0.3, models: {T4: 1}}\n")
    code = main(["simulate", "--mix", "small", "--mixes", str(mixes), "--seeds", "1",
                 "--policy", "fgd-balance", "--learn", "--learn-every", "100",
                 "--synthetic-nodes", "60", "--workers", "1", "--out", str(tmp_path / "out")])
    assert code == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["scenario"] == "mix-small" and summary["nodes"] == 60
    assert summary["learn_every"] == 100.0
    assert summary["runs"][0]["workload_refreshes"] > 0
    assert "workload learned every 100" in capsys.readouterr().out
