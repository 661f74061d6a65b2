"""``gpupool device-plugin`` as a process: flags, errors, and a real run."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.cli.main import main

from .builders import write_gpus
from .kubelet_standin import FakeKubelet


def test_missing_node_name_is_a_clear_error(capsys: object,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert main(["device-plugin", "--fake-gpus", "x.yaml"]) == 2
    assert "--node-name" in capsys.readouterr().err  # type: ignore[attr-defined]


def test_a_bad_fake_gpu_file_is_a_clear_error(tmp_path: Path, capsys: object) -> None:
    (tmp_path / "g.yaml").write_text("gpus: 1")
    assert main(["device-plugin", "--node-name", "n", "--fake-gpus",
                 str(tmp_path / "g.yaml")]) == 2
    assert "g.yaml:1:7: gpus: expected a list" in capsys.readouterr().err  # type: ignore[attr-defined]


def test_the_command_registers_with_kubelet_and_stops_on_sigterm(
        short_dir: Path, kubelet: FakeKubelet, apiserver: FakeApiServer) -> None:
    gpus = write_gpus(short_dir / "gpus.yaml", 2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpupool.cli.main", "device-plugin", "--node-name", "node-a",
         "--api-server", apiserver.url, "--kubelet-dir", str(kubelet.root),
         "--fake-gpus", str(gpus), "--split", "3", "--heartbeat-seconds", "60",
         "--isolation-provider", "none", "--metrics-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        kubelet.wait_registrations(1, timeout=30)
        kubelet.wait_update(lambda d: len(d) == 6)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "registered gpupool.io/gpu with kubelet" in out


def test_the_daemonset_passes_flags_the_command_accepts() -> None:
    import yaml

    from gpupool.cli.main import build_parser

    manifest = Path(__file__).resolve().parents[2] / "deploy" / "node-agent" / "daemonset.yaml"
    spec = yaml.safe_load(manifest.read_text())["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert container["command"] == ["gpupool", "device-plugin"]
    args = build_parser().parse_args(["device-plugin", *container["args"]])
    assert args.kubelet_dir == Path("/var/lib/kubelet")
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources"} <= mounts


def test_the_shipped_node_agent_runs_as_root_to_reach_kubelets_socket_folders() -> None:
    """The image's default user is 65532; kubelet's device-plugins, plugins_registry and
    plugins folders are root's, so the agent's container must run as uid 0 (with no
    capabilities and no privilege escalation: owning the folders is enough)."""
    root = Path(__file__).resolve().parents[2]
    assert "USER 65532" in (root / "deploy" / "Dockerfile").read_text()
    docs = yaml.safe_load_all((root / "deploy" / "node-agent" / "daemonset.yaml").read_text())
    ds = next(d for d in docs if d and d.get("kind") == "DaemonSet")
    (agent,) = [c for c in ds["spec"]["template"]["spec"]["containers"]]
    ctx = agent["securityContext"]
    assert ctx["runAsUser"] == 0 and ctx["runAsNonRoot"] is False
    assert ctx["allowPrivilegeEscalation"] is False and ctx["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"] for m in agent["volumeMounts"]}
    assert {"/var/lib/kubelet/device-plugins", "/var/lib/kubelet/plugins_registry",
            "/var/lib/kubelet/plugins"} <= mounts
