"""The commands of docs/quickstart.md and the files of examples/quickstart/ work as the
quick start says, and a reader that leaves early (| head) ends the output quietly."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.cli.main import main
from gpupool.nodeagent.fakegpus import FakeGpuBackend

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "docs" / "quickstart.md"


def commands() -> list[list[str]]:
    blocks = re.findall(r"```sh\n(.*?)```", QUICKSTART.read_text(encoding="utf-8"), re.S)
    lines = [line for block in blocks for line in block.splitlines()]
    return [shlex.split(line)[1:] for line in lines if line.startswith("gpupool ")]


def test_the_quick_start_has_its_simulate_and_inspect_commands() -> None:
    assert [argv[0] for argv in commands()] == ["simulate", "inspect", "inspect"]


@pytest.mark.parametrize("argv", commands(), ids=lambda argv: " ".join(argv[:1]))
def test_each_quick_start_command_runs_and_succeeds(
        argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(REPO)
    if "--out" in argv:
        argv[argv.index("--out") + 1] = str(tmp_path / "out")
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert ("unallocated GPU %" in out) if argv[0] == "simulate" else ("inference" in out)


def test_the_example_fake_gpus_are_two_t4s() -> None:
    backend = FakeGpuBackend(REPO / "examples" / "quickstart" / "fake-gpus.yaml")
    try:
        assert [(g.model, g.memory_mib) for g in backend.discover()] == [("Tesla-T4", 15360)] * 2
    finally:
        backend.close()


def test_output_read_by_a_reader_that_leaves_early_ends_quietly(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"  # a JSON answer far larger than a pipe's buffer
    cluster.write_text("nodes:\n  - name: n-{i}\n    replicas: 600\n    cpu: 8\n"
                       "    memory: 32Gi\n    gpus: {count: 1, model: T4, memory: 16Gi}\n")
    pod = REPO / "examples" / "quickstart" / "pod.yaml"
    proc = subprocess.run(
        f"{shlex.quote(sys.executable)} -m gpupool.cli.main inspect --nodes {cluster} "
        f"--pod {pod} -o json | head -c 10; echo \" ${{PIPESTATUS[0]}}\"",
        shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=60,
        check=False)
    assert proc.stdout == '{\n  "pod": 141\n'
    assert proc.stderr == ""
