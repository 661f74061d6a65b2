"""``gpupool inspect`` end to end on a tiny YAML cluster (answers checked by hand)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool.cli.main import main

DATA = Path(__file__).parent / "data"
CLUSTER = DATA / "tiny_cluster.yaml"


def inspect_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["inspect", "--nodes", str(CLUSTER), "--json", *args])
    return code, json.loads(capsys.readouterr().out)


def by_node(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["node"]: n for n in report["nodes"]}


def test_two_whole_gpus_fit_only_the_node_with_two(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = inspect_json(capsys, "--pod", str(DATA / "two_gpus_pod.yaml"))
    assert code == 0
    assert report["pod"] == "lab/train" and report["chosen"] == "big"
    assert report["request"] == "4000m CPU, 16384 MiB, 2 whole GPUs"
    nodes = by_node(report)
    assert [n["node"] for n in report["nodes"]] == ["big", "small", "cpu-only"]
    big = nodes["big"]
    assert big["fits"] and big["chosen"] and isinstance(big["score"], float)
    assert [(g["index"], g["memoryMiB"], g["corePct"]) for g in big["gpus"]] == [
        (0, 81920, 100), (1, 81920, 100)]
    assert nodes["small"]["reason"] == "node small: 2 GPUs needed, node has 1"
    assert nodes["small"]["check"] == "gpu-count" and nodes["small"]["permanent"]
    assert nodes["cpu-only"]["reason"] == "node cpu-only: 2 GPUs needed, node has 0"


def test_a_class_slice_fits_only_gpus_of_the_class(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = inspect_json(capsys, "--pod", str(DATA / "class_slice_pod.yaml"))
    assert code == 0
    nodes = by_node(report)
    [gpu] = nodes["big"]["gpus"]
    assert (gpu["memoryMiB"], gpu["corePct"], gpu["container"]) == (8192, 50, "model")
    assert nodes["small"]["reason"] == "node small: 1 GPUs of class big-memory needed, 0 here"
    assert nodes["small"]["check"] == "class"


def test_a_busy_gpu_is_the_reason_now_and_nothing_fits(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = inspect_json(capsys, "--pod", str(DATA / "two_gpus_pod.yaml"),
                                "--running", str(DATA / "one_a100_busy.yaml"))
    assert code == 1
    assert report["chosen"] is None
    assert report["running"] == {"placed": 1, "unplaced": []}
    big = by_node(report)["big"]
    assert big["reason"] == "node big: 2 idle GPUs needed, 1 idle"
    assert big["check"] == "gpu-free" and big["permanent"] is False


def test_an_unknown_class_is_refused_before_any_node(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    pod = tmp_path / "pod.yaml"
    pod.write_text("kind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n"
                   "    - {name: c, resources: {limits: {class.gpupool.io/h100: 1}}}\n")
    code, report = inspect_json(capsys, "--pod", str(pod))
    assert code == 1
    assert report["blocked"] == "resource class h100 does not exist (known: big-memory)"
    assert {n["check"] for n in report["nodes"]} == {"class"}


def test_the_table_marks_the_chosen_node_and_gives_reasons(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    code = main(["inspect", "--nodes", str(CLUSTER), "--pod", str(DATA / "two_gpus_pod.yaml"),
                 "--policy", "best-fit"])
    out = capsys.readouterr().out
    assert code == 0
    lines = out.splitlines()
    at = next(k for k, line in enumerate(lines) if "big" in line and "★" in line)
    assert "#0 81920 MiB 100 % (main)" in lines[at]  # a GPU a line
    assert "#1 81920 MiB 100 % (main)" in lines[at + 1]
    assert any("small" in line and "2 GPUs needed, node has 1" in line
               for line in out.splitlines())
    assert "1 of 3 nodes fit" in out and "policy best-fit" in out


@pytest.mark.parametrize(("args", "words"), [
    (["--pod", "missing.yaml"], "missing.yaml: no such file"),
    (["--pod", "{bad}"], "bad.yaml:3:1: not valid YAML"),
    (["--pod", "{deployment}"], "kind is 'Deployment'"),
    (["--pod", "{too_much_core}"], "gpupool.io/gpu-core=150 must be 1..100"),
    (["--pod", "{list}"], "expected one Pod object, got list"),
    (["--pod", "{ok}", "--policy", "fastest"], "--policy fastest: no such policy"),
    (["--pod", "{ok}", "--nodes", "{bad_cluster}"],
     "bad_cluster.yaml:2:42: nodes[0].gpus: missing required key 'memory'"),
    (["--pod", "{ok}", "--seed", "x"], "invalid int value"),
    (["nodes"], "--nodes FILE is for explaining offline; a live view reads the cluster"),
])
def test_bad_input_prints_one_line_and_exits_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], words: str) -> None:
    files = {
        "bad": "kind: Pod\nmetadata: [unclosed\n",
        "deployment": "kind: Deployment\nmetadata: {name: d}\n",
        "too_much_core": "kind: Pod\nmetadata: {name: x}\nspec:\n  containers:\n"
                         "    - {name: c, resources: {limits: {gpupool.io/gpu-core: 150}}}\n",
        "list": "- kind: Pod\n",
        "ok": (DATA / "two_gpus_pod.yaml").read_text(),
        "bad_cluster": "nodes:\n  - {name: n, cpu: 1, memory: 1Gi, gpus: {model: T4}}\n",
    }
    paths = {}
    for name, text in files.items():
        paths[name] = tmp_path / f"{name}.yaml"
        paths[name].write_text(text)
    argv = ["inspect", "--nodes", str(CLUSTER)]
    argv += [str(paths[a[1:-1]]) if a.startswith("{") else (
        str(tmp_path / a) if a.endswith(".yaml") else a) for a in args]
    code = exit_code(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2
    assert len(lines) == 1 and words in lines[0], captured.err
    assert captured.out == ""


def exit_code(argv: list[str]) -> int:
    """``main``'s return code, or the code argparse exits with on a bad flag."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def test_the_installed_command_explains_in_a_process() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gpupool.cli.main", "inspect", "--nodes", str(CLUSTER),
         "--pod", str(DATA / "two_gpus_pod.yaml"), "--json"],
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["chosen"] == "big"


def test_offline_yaml_is_the_same_report_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    _, as_json = inspect_json(capsys, "--pod", str(DATA / "two_gpus_pod.yaml"))
    code = main(["inspect", "--nodes", str(CLUSTER), "--pod", str(DATA / "two_gpus_pod.yaml"),
                 "--output", "yaml"])
    assert code == 0
    assert yaml.safe_load(capsys.readouterr().out) == as_json


def test_inspect_without_files_or_a_view_says_what_to_give(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["inspect"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == ("gpupool: name a live view (nodes, pod [NAMESPACE/]NAME, groups), or give "
                    "--nodes FILE and --pod FILE to explain offline")


@pytest.mark.parametrize(("flags", "form"), [
    (["--json", "-o", "yaml"], "yaml"), (["-o", "yaml", "--json"], "json"),
    (["-o", "json", "-o", "table"], "table")], ids=["yaml last", "json last", "table last"])
def test_of_json_and_output_the_last_one_given_wins(
        capsys: pytest.CaptureFixture[str], flags: list[str], form: str) -> None:
    main(["inspect", "--nodes", str(CLUSTER), "--pod", str(DATA / "two_gpus_pod.yaml"), *flags])
    out = capsys.readouterr().out
    assert out.startswith({"json": "{", "yaml": "pod: lab/train", "table": "lab/train: "}[form])


def test_the_table_lists_the_best_nodes_and_counts_the_others_by_reason(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "--nodes", str(CLUSTER), "--pod", str(DATA / "two_gpus_pod.yaml"),
                 "--policy", "best-fit", "--limit", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if line.startswith("│ ") and line[2:4].strip()]
    assert [row.split("│")[1].strip() for row in rows] == ["big"]
    assert lines[-3:] == ["2 more nodes not listed (--limit 0 lists every node):",
                          "  1 do not: 2 GPUs needed, node has 1",
                          "  1 do not: 2 GPUs needed, node has 0"]


def test_json_holds_every_node_whatever_the_limit(capsys: pytest.CaptureFixture[str]) -> None:
    _, report = inspect_json(capsys, "--pod", str(DATA / "two_gpus_pod.yaml"), "--limit", "1")
    assert len(report["nodes"]) == 3
