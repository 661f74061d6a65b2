"""``gpupool extender`` as a process: it rebuilds from the (fake) API server and serves."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx
from gpupool_testing.fake_apiserver import FakeApiServer

from .builders import pod_obj


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_extender_command_serves_decisions(fake: FakeApiServer, nodes: list[str]) -> None:
    pod = fake.seed("pods", pod_obj("a", {"gpupool.io/gpu": "1"}))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpupool.cli.main", "extender", "--server", fake.url,
         "--host", "127.0.0.1", "--port", str(port), "--policy", "best-fit",
         "--log-level", "WARNING"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        with httpx.Client(base_url=url, trust_env=False) as http:
            while True:
                try:
                    if http.get("/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline and proc.poll() is None, "did not start"
                time.sleep(0.1)
            answer = http.post("/filter", json={"Pod": pod, "NodeNames": nodes}).json()
            assert answer["NodeNames"] == nodes
            bound = http.post("/bind", json={"PodName": "a", "PodNamespace": "default",
                                             "PodUID": pod["metadata"]["uid"], "Node": nodes[1]})
            assert bound.json() == {"Error": ""}
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    assert fake.get("pods", "a", "default")["spec"]["nodeName"] == nodes[1]


def test_an_unknown_policy_is_refused_at_start() -> None:
    done = subprocess.run([sys.executable, "-m", "gpupool.cli.main", "extender", "--policy",
                           "nope"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "nope" in done.stderr
