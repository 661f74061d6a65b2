"""``gpupool extender`` as a process: it rebuilds from the (fake) API server and serves."""

from __future__ import annotations

import base64
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.extender.edge.tls import CLIENT_SECRET
from tests.ports import free_port

from .builders import NAMESPACE, pod_obj


def test_the_extender_command_serves_decisions_over_mutual_tls(
        fake: FakeApiServer, nodes: list[str], tmp_path: Path) -> None:
    pod = fake.seed("pods", pod_obj("a", {"gpupool.io/gpu": "1"}))
    port, probes = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpupool.cli.main", "extender", "--server", fake.url,
         "--host", "127.0.0.1", "--port", str(port), "--probe-port", str(probes),
         "--policy", "best-fit", "--log-level", "WARNING"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_ready(f"http://127.0.0.1:{probes}", proc)
        secret = fake.get("secrets", CLIENT_SECRET, NAMESPACE)
        data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
        (tmp_path / "tls.crt").write_text(data["tls.crt"])
        (tmp_path / "tls.key").write_text(data["tls.key"])
        ctx = ssl.create_default_context(cadata=data["ca.crt"])  # kube-scheduler's tlsConfig
        ctx.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
        with httpx.Client(base_url=f"https://127.0.0.1:{port}", verify=ctx,
                          trust_env=False) as http:
            sni = {"sni_hostname": f"gpupool-extender.{NAMESPACE}.svc"}
            answer = http.post("/filter", json={"Pod": pod, "NodeNames": nodes},
                               extensions=sni).json()
            assert answer["NodeNames"] == nodes
            bound = http.post("/bind", json={"PodName": "a", "PodNamespace": "default",
                                             "PodUID": pod["metadata"]["uid"], "Node": nodes[1]},
                              extensions=sni)
            assert bound.json() == {"Error": ""}
        with httpx.Client(base_url=f"https://127.0.0.1:{port}", trust_env=False,
                          verify=ssl.create_default_context(cadata=data["ca.crt"])) as anon, \
                pytest.raises(httpx.TransportError):
            anon.post("/bind", json={}, extensions=sni)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    stored = fake.get("pods", "a", "default")
    assert stored["spec"]["nodeName"] == nodes[1]
    assert stored["metadata"]["annotations"]["gpupool.io/signature"].startswith("v1.")
    assert fake.get("configmaps", "gpupool-decision-keys", NAMESPACE)["data"]


def wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    with httpx.Client(base_url=url, trust_env=False) as http:
        while True:
            try:
                if http.get("/readyz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                out = proc.stdout.read().decode() if proc.stdout and proc.poll() is not None \
                    else ""
                raise AssertionError(f"the extender did not start: {out}")
            time.sleep(0.1)


def test_an_unknown_policy_is_refused_at_start() -> None:
    done = subprocess.run([sys.executable, "-m", "gpupool.cli.main", "extender", "--policy",
                           "nope"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "nope" in done.stderr
