"""A node agent that starts before gpupool's decision keys are published — a fresh install,
where ``helm install`` starts every component at once — serves the first pods as soon as
the keys exist, instead of refusing them (kubelet would fail them for good)."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from pathlib import Path

from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.kube.api import KubeApi
from gpupool.kube.keystore import PUBLIC_CONFIG_MAP, publish

from .builders import KEYS, NAMESPACE, NODE, decision, pod, uuid_of, wait_for, write_gpus
from .kubelet_standin import FakeKubelet, runtime_gpus


def _key_reads(apiserver: FakeApiServer) -> int:
    return sum(1 for method, path in list(apiserver.requests)
               if method == "GET" and path.endswith(f"/configmaps/{PUBLIC_CONFIG_MAP}"))


def test_an_agent_started_before_the_keys_serves_the_first_pod_once_they_are_published(
        short_dir: Path, kubelet: FakeKubelet, apiserver: FakeApiServer) -> None:
    gpus = write_gpus(short_dir / "gpus.yaml", 2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpupool.cli.main", "device-plugin", "--node-name", NODE,
         "--server", apiserver.url, "--namespace", NAMESPACE,
         "--kubelet-dir", str(kubelet.root), "--fake-gpus", str(gpus), "--split", "3",
         "--heartbeat-seconds", "60", "--isolation-provider", "none", "--metrics-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        kubelet.wait_registrations(1)
        kubelet.wait_update(lambda d: len(d) == 6)
        wait_for(lambda: _key_reads(apiserver) >= 1)  # it looked, and found no keys
        api = KubeApi.connect(server=apiserver.url)
        try:
            publish(api, NAMESPACE, KEYS)  # the extender starts and publishes them
        finally:
            api.close()
        p = pod("p1", [("main", 1, 4096, 30)],
                ann=decision("p1", [(uuid_of(1), 1, 4096, 30, "main")]))
        apiserver.seed("pods", p)
        got = kubelet.admit(p, random.Random(1))
        assert runtime_gpus(got, "main") == [uuid_of(1)]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "decision keys not readable yet" in out
