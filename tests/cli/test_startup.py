"""``gpupool --help`` and the errors that need no heavy library load none: only the module
of the command being run is imported, and what a command needs to run (the plot, the HTTP
servers, the Kubernetes client) is imported once it runs. Which modules, not how long:
the time is measured by bench/bench_startup.py."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpupool.cli import defaults
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


GPUS = "gpus:\n  - {uuid: GPU-0, model: Tesla-T4, memoryMiB: 15360}\n"
"""A fake GPU file the node agent's checks accept, so that the kubeconfig comes next."""
SLICE = ("--pod-uid", "u1", "--pod-name", "lab/train", "--container", "main", "--gpu-uuid",
         "GPU-0", "--memory-mib", "1024", "--core-pct", "20")


@pytest.mark.parametrize(("argv", "allowed"), [
    (("controller", "--resync-seconds", "0"), set()),
    (("extender", "--port", "0"), set()),
    (("extender", "--policy", "bestfit"), set()),
    (("extender", "--weight", "fgd-balance.lamda=1"), {"numpy"}),
    (("extender", "--kubeconfig", "absent.yaml"), {"numpy", "lightkube", "httpx2"}),
    (("device-plugin", "--split", "x"), set()),
    (("device-plugin",), set()),
    (("device-plugin", "--node-name", "n1", "--fake-gpus", "absent.yaml"), {"numpy"}),
    (("device-plugin", "--node-name", "n1", "--fake-gpus", "gpus.yaml", "--kubeconfig",
      "absent.yaml"), {"numpy", "lightkube", "httpx2"}),
    (("webhook", "--port", "x"), set()),
    (("webhook", "--remote-provider", "stub"), set()),
    (("webhook", "--kubeconfig", "absent.yaml"), {"lightkube", "httpx2"}),
    (("mps-helper", "--socket"), set()),
    (("mps-helper", "--fake-gpus", "absent.yaml"), {"numpy"}),
    (("slice-server", *SLICE, "--core-pct", "200", "--credentials-dir", "absent"), set()),
    (("slice-server", *SLICE, "--provider", "command", "--credentials-dir", "absent"), set()),
    (("slice-server", *SLICE, "--credentials-dir", "absent"), {"cryptography"}),
    (("slice-client", "--pod-uid", "u1", "--slice-server", "bad", "--credentials-dir",
      "absent"), set()),
    (("slice-client", "--pod-uid", "u1", "--slice-server", "10.0.3.7:14900",
      "--credentials-dir", "absent"), {"cryptography"}),
], ids=["controller: bad flag", "extender: bad flag", "extender: unknown policy",
        "extender: unknown weight", "extender: no kubeconfig", "device-plugin: bad flag",
        "device-plugin: no node name", "device-plugin: no fake GPU file",
        "device-plugin: no kubeconfig",
        "webhook: bad flag", "webhook: no sidecar image", "webhook: no kubeconfig",
        "mps-helper: bad flag", "mps-helper: no fake GPU file", "slice-server: bad flag",
        "slice-server: no provider command", "slice-server: no credentials",
        "slice-client: bad flag", "slice-client: no credentials"])
def test_a_servers_error_before_it_starts_loads_only_what_its_check_needs(
        argv: tuple[str, ...], allowed: set[str], tmp_path: Path) -> None:
    """The credentials' own check reads them with cryptography: a missing file is found
    there."""
    (tmp_path / "gpus.yaml").write_text(GPUS)
    assert loaded(*argv, cwd=tmp_path) & set(HEAVY) <= allowed


@pytest.mark.parametrize("command", ["controller", "extender", "device-plugin", "webhook",
                                     "mps-helper", "slice-server", "slice-client",
                                     "slice-stub"])
def test_a_servers_help_loads_no_heavy_library(command: str) -> None:
    assert loaded(command, "--help") & set(HEAVY) == set()


KUBECTL_PROBE = PROBE.replace("gpupool.cli.main", "gpupool.cli.kubectl")


@pytest.mark.parametrize("argv", [("--help",), ("pod", "--help"), ("nodes", "-o", "xml")],
                         ids=["help", "a view's help", "bad flag"])
def test_the_kubectl_plugins_help_and_bad_flags_load_no_heavy_library(
        argv: tuple[str, ...]) -> None:
    proc = subprocess.run([sys.executable, "-c", KUBECTL_PROBE, *argv], capture_output=True,
                          text=True, check=True)
    assert set(json.loads(proc.stdout.splitlines()[-1])) & set(HEAVY) == set()


def test_the_help_line_of_a_command_not_built_is_the_one_its_module_registers() -> None:
    def lines(parser: argparse.ArgumentParser) -> dict[str, str | None]:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return {a.dest: a.help for a in sub._choices_actions}

    assert lines(build_parser(())) == lines(build_parser()) == COMMANDS


def test_the_command_is_the_first_word_that_is_not_an_option() -> None:
    assert command_of(["--version"]) is None
    assert command_of(["simulate", "--policy", "fgd"]) == "simulate"
    assert command_of(["-h", "inspect", "pod", "x"]) == "inspect"


def _values(enum: Any) -> tuple[str, ...]:
    return tuple(member.value for member in enum)


RESTATED: list[tuple[str, str, Callable[[Any], Any]]] = [
    ("POLICY_NAMES", "gpupool.core.policies", lambda m: tuple(sorted(m.POLICIES))),
    ("DEFAULT_POLICY", "gpupool.core.policies", lambda m: m.DEFAULT_POLICY),
    ("ZONE_LABEL", "gpupool.core.serving", lambda m: m.ZONE_LABEL),
    ("SCHEDULER_NAME", "gpupool.extender.bind.gate", lambda m: m.DEFAULT_SCHEDULER),
    ("GANG_TIMEOUT_S", "gpupool.extender.bind.gangclaims", lambda m: m.GANG_TIMEOUT_S),
    ("SERVING_SECRET", "gpupool.extender.edge.tls", lambda m: m.SERVING_SECRET),
    ("CLIENT_SECRET", "gpupool.extender.edge.tls", lambda m: m.CLIENT_SECRET),
    ("SERVICE", "gpupool.extender.edge.tls", lambda m: m.SERVICE),
    ("CLIENT_SCHEDULER", "gpupool.security.certs", lambda m: m.CLIENT_SCHEDULER),
    ("STRATEGIES", "gpupool.nodeagent.exposure", lambda m: _values(m.Strategy)),
    ("DEFAULT_STRATEGY", "gpupool.nodeagent.exposure", lambda m: m.Strategy.VOLUME_MOUNTS),
    ("DEFAULT_CDI_KIND", "gpupool.nodeagent.exposure", lambda m: m.DEFAULT_CDI_KIND),
    ("DEFAULT_CDI_DIR", "gpupool.nodeagent.dra.cdi", lambda m: m.DEFAULT_CDI_DIR),
    ("OVERUSE_ACTIONS", "gpupool.nodeagent.actions", lambda m: _values(m.OveruseAction)),
    ("DEFAULT_OVERUSE_ACTION", "gpupool.nodeagent.actions", lambda m: m.OveruseAction.WARN),
    ("ISOLATION_LABEL", "gpupool.nodeagent.isolation.provider", lambda m: m.NODE_LABEL),
    ("HAMI_CORE_LIBRARY", "gpupool.nodeagent.isolation.hamicore",
     lambda m: m.DEFAULT_LIBRARY),
    ("COMPUTE_MODE_SOCKET", "gpupool.nodeagent.isolation.computemode", lambda m: m.SOCKET),
]


@pytest.mark.parametrize(("name", "module", "source"), RESTATED,
                         ids=[name for name, _, _ in RESTATED])
def test_a_value_the_flags_restate_is_the_one_of_its_module(
        name: str, module: str, source: Callable[[Any], Any]) -> None:
    assert getattr(defaults, name) == source(importlib.import_module(module))


def test_every_restated_value_is_checked() -> None:
    restated = {n for n in vars(defaults) if n.isupper()}
    assert restated == {name for name, _, _ in RESTATED}
