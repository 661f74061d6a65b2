"""A webhook served over real HTTPS on loopback, its certificate made by gpupool's own CA in
a FAKE API server seeded with the shipped webhook configurations; a client that trusts
exactly the caBundle the webhook wrote there (as the API server does) and names the
Service's DNS name (as the API server does)."""

from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.kube.webhook_ops import WebhookApi
from gpupool.webhook.admission import Settings
from gpupool.webhook.certificates import CertificateKeeper, CertificatePlan
from gpupool.webhook.decisions import NODE_AGENT_KEYS, Writers
from gpupool.webhook.metrics import Metrics
from gpupool.webhook.server import HttpsServer, WebhookApp
from gpupool.webhook.tls import ServingTls

from .builders import EXTENDER, NODE_AGENT

DEPLOY = Path(__file__).parents[2] / "deploy" / "webhook"
NAMESPACE, SERVICE, SECRET = "gpupool-system", "gpupool-webhook", "gpupool-webhook-tls"
HOST = f"{SERVICE}.{NAMESPACE}.svc"
PLURALS = {"MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
           "ValidatingWebhookConfiguration": "validatingwebhookconfigurations"}


def shipped_configurations() -> list[dict[str, Any]]:
    return list(yaml.safe_load_all((DEPLOY / "webhooks.yaml").read_text()))


@dataclass
class Webhook:
    fake: FakeApiServer
    api: WebhookApi
    keeper: CertificateKeeper
    tls: ServingTls
    metrics: Metrics
    port: int

    def bundle(self, kind: str = "ValidatingWebhookConfiguration") -> str:
        """The PEM the API server would trust: the configuration's first caBundle."""
        obj = self.fake.get(PLURALS[kind], "gpupool-webhook")
        assert obj is not None
        return base64.b64decode(obj["webhooks"][0]["clientConfig"]["caBundle"]).decode()

    def connect(self, ca_pem: str | None = None) -> ssl.SSLSocket:
        ctx = ssl.create_default_context(cadata=ca_pem or self.bundle())
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        # As http.client's own connect() and Go's net/http (the API server) do: without it a
        # request or an answer written in two parts waits out the delayed ACK (~40 ms).
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return ctx.wrap_socket(raw, server_hostname=HOST)

    def post(self, path: str, payload: bytes, ca_pem: str | None = None
             ) -> tuple[int, dict[str, Any]]:
        conn = http.client.HTTPConnection(HOST, timeout=10)
        conn.sock = self.connect(ca_pem)
        try:
            return post_on(conn, path, payload)
        finally:
            conn.close()

    @contextmanager
    def kept_alive(self) -> Iterator[http.client.HTTPConnection]:
        """One HTTPS connection for many requests (``post_on``), as the API server keeps
        its connections to a webhook alive."""
        conn = http.client.HTTPConnection(HOST, timeout=10)
        conn.sock = self.connect()
        try:
            yield conn
        finally:
            conn.close()

    def get(self, path: str) -> tuple[int, str]:
        conn = http.client.HTTPConnection(HOST, timeout=10)
        conn.sock = self.connect()
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read().decode()
        finally:
            conn.close()


def post_on(conn: http.client.HTTPConnection, path: str, payload: bytes
            ) -> tuple[int, dict[str, Any]]:
    conn.request("POST", path, payload, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read() or b"{}")


SETTINGS = Settings("gpupool-scheduler", Writers({NODE_AGENT: NODE_AGENT_KEYS},
                                                 frozenset({EXTENDER})))


def plan(managed: bool = True) -> CertificatePlan:
    return CertificatePlan(NAMESPACE, SERVICE, SECRET,
                           tuple((kind, "gpupool-webhook") for kind in PLURALS), managed)


@pytest.fixture
def webhook(tmp_path: Path) -> Iterator[Webhook]:
    with FakeApiServer() as fake:
        for doc in shipped_configurations():
            fake.seed(PLURALS[doc["kind"]], doc)
        api = WebhookApi.open(server=fake.url)
        metrics = Metrics()
        tls = ServingTls(tmp_path / "tls")
        keeper = CertificateKeeper(api, plan(), tls, time.time, metrics)
        keeper.refresh()
        server = HttpsServer(WebhookApp(SETTINGS, metrics, lambda: tls.loaded).app, tls,
                             "127.0.0.1", 0, closed=metrics.closed)
        port = server.start()
        try:
            yield Webhook(fake, api, keeper, tls, metrics, port)
        finally:
            server.stop()
            api.close()
