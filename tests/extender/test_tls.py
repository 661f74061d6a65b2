"""Only kube-scheduler may call the verbs: real HTTPS on loopback, mutual TLS with the
certificates gpupool makes for itself; unauthenticated and wrong-certificate calls are
refused on every verb, and a renewed certificate is used without a restart."""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gpupool_testing.fake_apiserver import FakeApiServer
from prometheus_client import generate_latest

from gpupool.extender.edge.app import build_probes, build_verbs
from gpupool.extender.edge.connections import ConnectionRules
from gpupool.extender.edge.server import ThreadedServer
from gpupool.extender.edge.tls import (
    CLIENT_SECRET,
    SERVING_SECRET,
    ReloadingContext,
    ServingMaterial,
    TlsSource,
)
from gpupool.kube import tlsstore
from gpupool.security import certs

from .builders import NAMESPACE, Replica, pod_obj

VERBS = ("filter", "prioritize", "bind", "preempt")
SERVICE_NAME = f"gpupool-extender.{NAMESPACE}.svc"  # the name in the URL kube-scheduler calls


def post(http: httpx.Client, verb: str, body: Any) -> httpx.Response:
    """A call as kube-scheduler makes it: to the Service's name (here on 127.0.0.1, so the
    name the certificate is checked against is given as the server name, as tlsConfig's
    serverName does)."""
    return http.post(f"/{verb}", json=body, extensions={"sni_hostname": SERVICE_NAME})


def write_pair(folder: Path, name: str, pair: certs.PemPair) -> tuple[str, str]:
    cert, key = folder / f"{name}.crt", folder / f"{name}.key"
    cert.write_text(pair.cert)
    key.write_text(pair.key)
    return str(cert), str(key)


def client_context(ca: str, pair: tuple[str, str] | None) -> ssl.SSLContext:
    """What kube-scheduler's tlsConfig makes: caFile (+ certFile/keyFile)."""
    ctx = ssl.create_default_context(cadata=ca)
    if pair is not None:
        ctx.load_cert_chain(*pair)
    return ctx


class Served:
    """An extender replica serving its verbs over mutual TLS on 127.0.0.1."""

    def __init__(self, fake: FakeApiServer, folder: Path):
        self.replica = Replica(fake)
        self.source = TlsSource(NAMESPACE)
        self.tls = ReloadingContext(self.source.material(self.replica.api, time.time()))
        names = frozenset({certs.CLIENT_SCHEDULER})
        self.server = ThreadedServer(build_verbs(self.replica.extender), "127.0.0.1",
                                     tls=self.tls.listening,
                                     rules=ConnectionRules(client_names=names))
        self.url = self.server.start()
        client = tlsstore.read_pair(self.replica.api, NAMESPACE, CLIENT_SECRET)
        self.ca = client.ca_cert
        self.scheduler = write_pair(folder, "scheduler", client.pair)
        self.folder = folder

    def client(self, pair: tuple[str, str] | None, ca: str | None = None) -> httpx.Client:
        return httpx.Client(base_url=self.url, verify=client_context(ca or self.ca, pair),
                            trust_env=False, timeout=10)

    def close(self) -> None:
        self.server.stop()
        self.replica.close()


@pytest.fixture
def served(fake: FakeApiServer, nodes: list[str], tmp_path: Path) -> Iterator[Served]:
    s = Served(fake, tmp_path)
    yield s
    s.close()


def bodies(pod: dict[str, Any], nodes: list[str]) -> dict[str, dict[str, Any]]:
    meta = pod["metadata"]
    return {"filter": {"Pod": pod, "NodeNames": nodes},
            "prioritize": {"Pod": pod, "NodeNames": nodes},
            "bind": {"PodName": meta["name"], "PodNamespace": meta["namespace"],
                     "PodUID": meta["uid"], "Node": nodes[0]},
            "preempt": {"Pod": pod, "NodeNameToMetaVictims": {}}}


def test_the_scheduler_certificate_gets_answers_on_every_verb(
        served: Served, fake: FakeApiServer, nodes: list[str]) -> None:
    pod = fake.seed("pods", pod_obj("a", {"gpupool.io/gpu": "1"}))
    calls = bodies(pod, nodes)
    with served.client(served.scheduler) as http:
        answers = {verb: post(http, verb, calls[verb]) for verb in VERBS}
        assert all(a.status_code == 200 for a in answers.values())
        assert answers["filter"].json()["NodeNames"] == nodes
        assert answers["bind"].json() == {"Error": ""}
        assert http.get("/healthz", extensions={"sni_hostname": SERVICE_NAME}
                        ).status_code == 404  # the probes live on the plain port
    assert fake.get("pods", "a", "default")["spec"]["nodeName"] == nodes[0]


@pytest.mark.parametrize("who", ["no certificate", "another CA", "same CA, other name",
                                 "the serving certificate"])
def test_every_verb_refuses_callers_without_the_scheduler_certificate(
        who: str, served: Served, fake: FakeApiServer, nodes: list[str]) -> None:
    pod = fake.seed("pods", pod_obj("a", {"gpupool.io/gpu": "1"}))
    now = time.time()
    ca = tlsstore.ensure_ca(served.replica.api, NAMESPACE, now)
    stranger = certs.new_ca("someone-else", now)
    pairs = {
        "no certificate": None,
        "another CA": write_pair(served.folder, "other", certs.issue(
            stranger, certs.CLIENT_SCHEDULER, now, client=True)),
        "same CA, other name": write_pair(served.folder, "tenant", certs.issue(
            ca, "system:serviceaccount:team-b:default", now, client=True)),
        "the serving certificate": write_pair(served.folder, "serving", tlsstore.read_pair(
            served.replica.api, NAMESPACE, SERVING_SECRET).pair),
    }
    calls = bodies(pod, nodes)
    for verb in VERBS:
        with served.client(pairs[who]) as http, pytest.raises(httpx.TransportError):
            post(http, verb, calls[verb])
    assert fake.get("pods", "a", "default")["spec"].get("nodeName") is None
    if who == "same CA, other name":
        metrics = generate_latest(served.replica.extender.metrics.registry).decode()
        assert 'gpupool_extender_connections_closed_total{reason="client-certificate"} 4.0' \
            in metrics


def test_a_client_that_does_not_trust_gpupools_ca_does_not_talk_to_it(
        served: Served, nodes: list[str]) -> None:
    other = certs.new_ca("elsewhere", time.time())
    with served.client(served.scheduler, ca=other.cert) as http, \
            pytest.raises(httpx.ConnectError):
        post(http, "filter", {"Pod": {}, "NodeNames": nodes})


def test_a_renewed_serving_certificate_is_used_by_the_next_connection(
        served: Served, nodes: list[str]) -> None:
    def serial() -> int:
        host, port = served.url.removeprefix("https://").rsplit(":", 1)
        ctx = client_context(served.ca, served.scheduler)
        with socket.create_connection((host, int(port))) as raw, \
                ctx.wrap_socket(raw, server_hostname=SERVICE_NAME) as conn:
            der = conn.getpeercert(binary_form=True)
        assert der is not None
        return int(certs.load_certificate(ssl.DER_cert_to_PEM_cert(der)).serial_number)

    before = serial()
    api = served.replica.api
    ca = tlsstore.ensure_ca(api, NAMESPACE, time.time())
    _, version = api.get_secret_data(NAMESPACE, SERVING_SECRET)
    fresh = certs.issue(ca, "gpupool-extender", time.time(),
                        dns_names=certs.service_names("gpupool-extender", NAMESPACE))
    api.put_secret_data(NAMESPACE, SERVING_SECRET, {"tls.crt": fresh.cert, "tls.key": fresh.key,
                                                    "ca.crt": ca.cert}, version,
                        tlsstore.TLS_TYPE)
    assert served.tls.update(served.source.material(api, time.time()))
    after = serial()
    assert after != before and after == fresh.certificate().serial_number
    assert not served.tls.update(served.source.material(api, time.time()))  # nothing new


def test_the_probes_answer_on_plain_http_and_serve_no_verb(replica: Replica) -> None:
    with ThreadedServer(build_probes(replica.extender)) as server, \
            httpx.Client(base_url=server.url, trust_env=False) as http:
        assert http.get("/healthz").text == "ok"
        assert http.get("/readyz").status_code == 200
        assert "gpupool_extender_unverified_decisions_total" in http.get("/metrics").text
        assert all(http.post(f"/{verb}", json={}).status_code in (404, 405) for verb in VERBS)


def test_a_new_client_ca_is_what_the_next_handshake_checks_against(
        served: Served, nodes: list[str]) -> None:
    now = time.time()
    fresh_ca = certs.new_ca("gpupool-ca-2", now)
    serving = certs.issue(fresh_ca, "gpupool-extender", now,
                          dns_names=certs.service_names("gpupool-extender", NAMESPACE))
    client = write_pair(served.folder, "client-2", certs.issue(
        fresh_ca, certs.CLIENT_SCHEDULER, now, client=True))
    assert served.tls.update(ServingMaterial(serving.cert, serving.key, fresh_ca.cert))
    with served.client(client, ca=fresh_ca.cert) as http:
        assert post(http, "filter", {"Pod": pod_obj("x"), "NodeNames": nodes}).status_code == 200
    with served.client(served.scheduler, ca=fresh_ca.cert) as http, \
            pytest.raises(httpx.TransportError):  # issued by the CA that was replaced
        post(http, "filter", {"Pod": pod_obj("x"), "NodeNames": nodes})
