"""``gpupool webhook`` as a process against the FAKE API server: it watches namespaces and
judges GPU pods by their namespace's placement labels, following a label changed while it
runs."""

from __future__ import annotations

import base64
import http.client
import json
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.webhook.placement import LABEL_DEFAULT, LABEL_MINIMUM
from tests.ports import free_port
from tests.waiting import wait_for

from .builders import body, review
from .conftest import HOST, PLURALS, post_on, shipped_configurations
from .test_namespace_placement import train


@contextmanager
def serving(fake: FakeApiServer, tmp: Path) -> Iterator[int]:
    """``gpupool webhook`` on a free port until the block ends (then SIGTERM, exit 0)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpupool.cli.main", "webhook", "--server", fake.url,
         "--host", "127.0.0.1", "--port", str(port), "--metrics-port", "0",
         "--cert-dir", str(tmp / "tls")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out


def bundle(fake: FakeApiServer) -> str:
    obj = fake.get(PLURALS["MutatingWebhookConfiguration"], "gpupool-webhook") or {}
    hooks = obj.get("webhooks") or [{}]
    return base64.b64decode(hooks[0].get("clientConfig", {}).get("caBundle", "")).decode()


def post(port: int, ca: str, path: str, obj: dict[str, Any]) -> dict[str, Any]:
    ctx = ssl.create_default_context(cadata=ca)
    conn = http.client.HTTPConnection(HOST, timeout=10)
    conn.sock = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10),
                                server_hostname=HOST)
    try:
        status, out = post_on(conn, path, body(review(obj)))
    finally:
        conn.close()
    assert status == 200, out
    response: dict[str, Any] = out["response"]
    return response


def answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def placement_written(response: dict[str, Any]) -> str | None:
    for op in json.loads(base64.b64decode(response.get("patch") or "W10=")):
        if op["path"] == "/metadata/annotations":
            return str(op["value"].get("gpupool.io/placement"))
    return None


def test_the_served_webhook_judges_pods_by_their_namespaces_labels(tmp_path: Path) -> None:
    with FakeApiServer() as fake:
        for doc in shipped_configurations():
            fake.seed(PLURALS[doc["kind"]], doc)
        fake.seed("namespaces", {"metadata": {"name": "lab", "labels": {
            LABEL_DEFAULT: "remote-allowed", LABEL_MINIMUM: "remote-allowed"}}})
        with serving(fake, tmp_path) as port:
            assert wait_for(lambda: bundle(fake) != "" and answers(port), 60)
            ca = bundle(fake)
            assert placement_written(post(port, ca, "/mutate", train())) == "remote-allowed"
            refused = post(port, ca, "/validate", train("local"))
            assert not refused["allowed"]
            assert "below the minimum of namespace lab, remote-allowed" in \
                refused["status"]["message"]
            fake.patch("namespaces", "lab", {"metadata": {"labels": {
                LABEL_DEFAULT: "local", LABEL_MINIMUM: None}}})
            assert wait_for(lambda: placement_written(post(port, ca, "/mutate", train()))
                            == "local")
            assert post(port, ca, "/validate", train("local"))["allowed"]
