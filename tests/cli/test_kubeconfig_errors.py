"""Every command that talks to a cluster says in one line, exit 2, what is wrong with its
kubeconfig — missing, broken YAML, an unknown context, a server nobody answers at — as
``gpupool <command>: kubeconfig <path>: <what> (<hint>)``, never a traceback."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from gpupool.cli import kubectl
from gpupool.cli.main import main

COMMANDS: dict[str, list[str]] = {
    "extender": ["extender", "--plain-http"],
    "device-plugin": ["device-plugin", "--node-name", "n1", "--fake-gpus", "{gpus}"],
    "controller": ["controller", "--once"],
    "webhook": ["webhook"],
    "inspect": ["inspect", "nodes"],
    "keys": ["keys", "show"],
}


def closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return int(s.getsockname()[1])


def kubeconfig(server: str, current: str = "one") -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": current,
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "one", "context": {"cluster": "c", "user": "u"}}]})


BROKEN: dict[str, tuple[Callable[[int], str | None], str]] = {
    "missing": (lambda port: None,
                "no such file (check the path; without --kubeconfig, KUBECONFIG and then "
                "~/.kube/config are read, as kubectl does)"),
    "broken YAML": (lambda port: "clusters: [unclosed\n",
                    "not valid YAML (line 2, column 1: expected ',' or ']', but got "
                    "'<stream end>')"),
    "an unknown context": (lambda port: kubeconfig(f"https://127.0.0.1:{port}", "two"),
                           "context 'two' (current-context in {path}) does not exist "
                           "(known: one)"),
    "an unreachable server": (lambda port: kubeconfig(f"https://127.0.0.1:{port}"),
                              "server https://127.0.0.1:{port} (context one) cannot be "
                              "reached: connection refused (is the cluster running and is "
                              "this its address? `kubectl cluster-info` tries the same)"),
}


@pytest.mark.parametrize("what", list(BROKEN))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_bad_kubeconfig_is_one_line_naming_command_file_and_what(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        command: str, what: str) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "gpupool-system")
    port = closed_port()
    text, words = BROKEN[what]
    path = tmp_path / "kubeconfig"
    body = text(port)
    if body is not None:
        path.write_text(body)
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text("gpus: [{uuid: GPU-0, memoryMiB: 16384}]\n")
    argv = [a.format(gpus=gpus) for a in COMMANDS[command]]
    code = main([*argv, "--kubeconfig", str(path)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err == (f"gpupool {command}: kubeconfig {path}: "
                   f"{words.format(path=path, port=port)}\n")


@pytest.mark.parametrize("what", ["missing", "an unreachable server"])
def test_the_kubectl_plugin_says_the_same_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], what: str) -> None:
    port = closed_port()
    text, words = BROKEN[what]
    path = tmp_path / "kubeconfig"
    body = text(port)
    if body is not None:
        path.write_text(body)
    assert kubectl.main(["nodes", "--kubeconfig", str(path)]) == 2
    assert capsys.readouterr().err == (f"kubectl gpupool: kubeconfig {path}: "
                                       f"{words.format(path=path, port=port)}\n")


def test_without_a_kubeconfig_anywhere_the_line_says_where_it_looked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["controller", "--once"]) == 2
    err = capsys.readouterr().err
    assert err == (f"gpupool controller: no Kubernetes configuration: KUBECONFIG is not set "
                   f"and {tmp_path}/.kube/config does not exist, and this is not a pod with a "
                   "service account (give --kubeconfig FILE)\n")


def test_kubeconfig_is_read_as_kubectl_reads_it_from_the_home_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".kube").mkdir()
    port = closed_port()
    (tmp_path / ".kube" / "config").write_text(kubeconfig(f"https://127.0.0.1:{port}"))
    assert main(["keys", "show"]) == 2
    assert capsys.readouterr().err.startswith(
        f"gpupool keys: kubeconfig {tmp_path}/.kube/config: server https://127.0.0.1:{port} ")
