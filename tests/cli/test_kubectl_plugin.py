"""``kubectl-gpupool``: the plugin entry point, its options and its help, as kubectl runs it.

The world and the helpers are those of ``test_inspect_live`` (the FAKE API server).
"""

from __future__ import annotations

import inspect
import json
import re
import socket
from pathlib import Path
from typing import Any

import pytest

import gpupool.cli.inspect_cluster
import gpupool.cli.inspect_live
import gpupool.cli.inspect_report
import gpupool.kube.api
import gpupool.kube.kubeconfig
from gpupool.cli import kubectl
from gpupool.cli.main import main as gpupool_main

from .test_inspect_live import command, run, run_json, world

__all__ = ["world"]  # the fixture, shared with test_inspect_live


def test_options_may_come_before_or_after_the_view(
        world: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = run_json(capsys, "--kubeconfig", str(world), "groups")
    assert kubectl.main(["-o", "json", "groups", "--kubeconfig", str(world)]) == 0
    assert json.loads(capsys.readouterr().out) == before



def test_kubectl_gpupool_as_a_process_shows_groups_as_a_table(world: Path) -> None:
    proc = run(command("kubectl-gpupool"), "groups", "--kubeconfig", str(world))
    assert proc.returncode == 0, proc.stderr
    [row] = [line for line in proc.stdout.splitlines() if "team-a-pool" in line]
    assert "3/4 of 4 members" in row and "20480/60000" in row and "60/-" in row
    assert any("broken" in line and "BROKEN: spec.quota has unknown keys gpuz" in line
               for line in proc.stdout.splitlines())


def test_kubectl_gpupool_as_a_process_shows_a_pod_as_json(world: Path) -> None:
    proc = run(command("kubectl-gpupool"), "pod", "train-2", "-o", "json",
               env={"KUBECONFIG": str(world)})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["decision"]["gpus"][0]["uuid"] == "GPU-gpu-b-1"
    assert report["signature"]["state"] == "verified"



def internal_names() -> set[str]:
    """Class names of the modules behind the commands (users never see these)."""
    modules = (gpupool.cli.inspect_cluster, gpupool.cli.inspect_live,
               gpupool.cli.inspect_report, gpupool.kube.api, gpupool.kube.kubeconfig)
    kinds = {"GPUDevice", "ResourceClass", "ResourceGroup", "GPULedger",  # kinds users write
             "Pod", "Node", "Secret", "ConfigMap", "Event"}
    return {name for m in modules for name, obj in vars(m).items()
            if inspect.isclass(obj) and obj.__module__.startswith(("gpupool", "lightkube"))
            } - kinds


def help_text(capsys: pytest.CaptureFixture[str], entry: object, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as done:
        entry(argv)  # type: ignore[operator]
    assert done.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    ["--help"], ["nodes", "--help"], ["pod", "--help"], ["groups", "--help"]])
def test_help_speaks_to_users(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    names = internal_names()
    assert {"KubeApi", "LiveCluster", "Loaded"} <= names  # the check looks at real names
    for entry, prefix in ((kubectl.main, []), (gpupool_main, ["inspect"])):
        text = help_text(capsys, entry, prefix + argv)
        assert "`" not in text
        assert not names & set(re.findall(r"[A-Za-z_]+", text)), text
        if argv == ["--help"]:
            assert "nodes [NODE ...]" in text and "pod [NS/]NAME" in text
            assert "KUBECONFIG" in text and "~/.kube/config" in text


def test_the_plugin_is_installed_under_the_name_kubectl_looks_for(tmp_path: Path) -> None:
    proc = run(command("kubectl-gpupool"), "--version")
    assert proc.returncode == 0 and proc.stdout.startswith("gpupool ")


def test_a_bad_flag_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        kubectl.main(["nodes", "-o", "xml"])
    assert done.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("kubectl gpupool nodes: argument -o/--output: invalid choice: 'xml'")


def test_no_view_prints_the_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert kubectl.main([]) == 2
    assert "kubectl gpupool nodes [NODE ...]" in capsys.readouterr().out


@pytest.mark.parametrize(("extra", "words"), [
    ({"cluster": {"server": "https://127.0.0.1:{port}", "certificate-authority": "{ca}"}},
     "kubeconfig {path}: context one: cannot set up a connection to https://127.0.0.1:{port} "
     "(SSLError: "),
    ({"user": {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1",
                        "command": "no-such-credential-plugin"}}},
     "calling the Kubernetes API at https://127.0.0.1:{port} (context one of kubeconfig {path}) "
     "failed: FileNotFoundError: "),
])
def test_credentials_that_cannot_be_used_are_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: dict[str, Any],
        words: str) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("not a certificate\n")
    listening = socket.create_server(("127.0.0.1", 0))  # accepts; never answers
    port = listening.getsockname()[1]
    cluster = {"server": f"https://127.0.0.1:{port}"}
    user: dict[str, Any] = {"token": "t"}
    if "cluster" in extra:
        cluster = {k: v.format(ca=ca, port=port) for k, v in extra["cluster"].items()}
    if "user" in extra:
        user = extra["user"]
    path = tmp_path / "config"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "one",
        "clusters": [{"name": "one", "cluster": cluster}],
        "contexts": [{"name": "one", "context": {"cluster": "one", "user": "one"}}],
        "users": [{"name": "one", "user": user}]}))
    with listening:
        assert kubectl.main(["groups", "--kubeconfig", str(path)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("kubectl gpupool: " + words.format(path=path, port=port)), line
