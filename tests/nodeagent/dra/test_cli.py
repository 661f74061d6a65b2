"""``gpupool device-plugin`` on a node labelled for DRA serves the DRA plugin, not the
device plugin."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract import dra

from ..builders import NODE, wait_for, write_gpus
from .kubelet_dra import FakeDraKubelet


def test_a_node_labelled_dra_gets_the_dra_plugin_and_its_slice(
        short_dir: Path, apiserver: FakeApiServer) -> None:
    apiserver.seed("nodes", {"metadata": {"name": NODE,
                                          "labels": {dra.NODE_MODE_LABEL: dra.MODE_DRA}}})
    gpus = write_gpus(short_dir / "gpus.yaml", 2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpupool.cli.main", "device-plugin", "--node-name", NODE,
         "--api-server", apiserver.url, "--kubelet-dir", str(short_dir / "kubelet"),
         "--fake-gpus", str(gpus), "--cdi-dir", str(short_dir / "cdi"),
         "--state-dir", str(short_dir / "state"), "--isolation-provider", "none",
         "--metrics-port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    kubelet = FakeDraKubelet(short_dir / "kubelet")
    try:
        info = kubelet.discover(timeout_s=30)
        assert info.name == dra.DRIVER
        wait_for(lambda: apiserver.get("resourceslices", dra.slice_name(NODE)), timeout=30)
        assert not (short_dir / "kubelet" / "device-plugins" / "gpupool.sock").exists()
    finally:
        kubelet.close()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "serves GPUs through DRA" in out
