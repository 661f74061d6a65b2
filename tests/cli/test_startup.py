"""``gpupool --help`` and the errors that need no heavy library load none: only the module
of the command being run is imported, and what a command needs to run (the plot, the HTTP
servers, the Kubernetes client) is imported once it runs. Which modules, not how long:
the time is measured by bench/bench_startup.py."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.cli.main import COMMANDS, build_parser, command_of

HEAVY = ("matplotlib", "starlette", "uvicorn", "lightkube", "httpx2", "numpy", "grpc",
         "prometheus_client", "cryptography")

PROBE = """
import json, sys
from gpupool.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
sys.stdout = sys.__stdout__
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
"""


def loaded(*argv: str, cwd: Path | None = None) -> set[str]:
    """The top-level packages a ``gpupool`` process has imported when ``argv`` is done."""
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True,
                          text=True, check=True, cwd=cwd)
    return set(json.loads(proc.stdout.splitlines()[-1]))


def test_help_loads_no_heavy_library() -> None:
    assert loaded("--help") & set(HEAVY) == set()


def test_an_unknown_command_loads_no_heavy_library() -> None:
    assert loaded("simulat") & set(HEAVY) == set()


@pytest.mark.parametrize(("argv", "allowed"), [
    (("simulate", "--policy", "bestfit"), {"numpy"}),
    (("simulate", "--nodes", "absent.csv", "--pods", "absent.csv"), {"numpy"}),
    (("simulate", "--seeds", "x"), {"numpy"}),
    (("controller", "--once", "--kubeconfig", "absent.yaml"), {"lightkube", "httpx2"}),
    (("inspect", "--nodes", "absent.yaml", "--pod", "absent.yaml"), {"numpy"}),
], ids=["unknown policy", "no such file", "bad flag", "no kubeconfig", "inspect: no file"])
def test_an_error_before_any_work_loads_only_what_its_check_needs(
        argv: tuple[str, ...], allowed: set[str], tmp_path: Path) -> None:
    assert loaded(*argv, cwd=tmp_path) & set(HEAVY) <= allowed


def test_the_help_line_of_a_command_not_built_is_the_one_its_module_registers() -> None:
    def lines(parser: argparse.ArgumentParser) -> dict[str, str | None]:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return {a.dest: a.help for a in sub._choices_actions}

    assert lines(build_parser(())) == lines(build_parser()) == COMMANDS


def test_the_command_is_the_first_word_that_is_not_an_option() -> None:
    assert command_of(["--version"]) is None
    assert command_of(["simulate", "--policy", "fgd"]) == "simulate"
    assert command_of(["-h", "inspect", "pod", "x"]) == "inspect"
