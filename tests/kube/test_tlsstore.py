"""gpupool's CA and leaf certificates in Secrets: made once, agreed on, renewed when due."""

from __future__ import annotations

import threading

from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.kube import tlsstore
from gpupool.kube.api import KubeApi
from gpupool.security import certs

NS = "gpupool-system"
NOW = 1_800_000_000.0
DAY = 86400.0
NAMES = certs.service_names("gpupool-extender", NS)


def test_a_server_certificate_is_issued_once_and_kept(api: KubeApi, fake: FakeApiServer) -> None:
    ca = tlsstore.ensure_ca(api, NS, NOW)
    leaf = tlsstore.ensure_leaf(api, NS, "ext-tls", ca, "gpupool-extender", NOW,
                                dns_names=NAMES)
    assert certs.covers(leaf.pair.cert, NAMES) and leaf.ca_cert == ca.cert
    secret = fake.get("secrets", "ext-tls", NS)
    assert secret is not None and secret["type"] == "kubernetes.io/tls"
    again = tlsstore.ensure_leaf(api, NS, "ext-tls", tlsstore.ensure_ca(api, NS, NOW + DAY),
                                 "gpupool-extender", NOW + DAY, dns_names=NAMES)
    assert again.pair == leaf.pair


def test_a_certificate_is_renewed_when_due_or_when_names_change(api: KubeApi) -> None:
    ca = tlsstore.ensure_ca(api, NS, NOW)
    leaf = tlsstore.ensure_leaf(api, NS, "ext-tls", ca, "x", NOW, dns_names=NAMES)
    late = tlsstore.ensure_leaf(api, NS, "ext-tls", ca, "x", NOW + 250 * DAY, dns_names=NAMES)
    assert late.pair != leaf.pair
    renamed = tlsstore.ensure_leaf(api, NS, "ext-tls", ca, "x", NOW + 251 * DAY,
                                   dns_names=[*NAMES, "extra.example"])
    assert certs.covers(renamed.pair.cert, ["extra.example"])


def test_a_certificate_from_another_ca_is_replaced(api: KubeApi) -> None:
    other = certs.new_ca("someone-else", NOW)
    forged = certs.issue(other, "x", NOW, dns_names=NAMES)
    api.put_secret_data(NS, "ext-tls", {"tls.crt": forged.cert, "tls.key": forged.key,
                                        "ca.crt": other.cert}, None, "kubernetes.io/tls")
    ca = tlsstore.ensure_ca(api, NS, NOW)
    leaf = tlsstore.ensure_leaf(api, NS, "ext-tls", ca, "x", NOW, dns_names=NAMES)
    assert certs.signed_by(leaf.pair.cert, ca.cert)


def test_replicas_starting_together_agree_on_one_ca(fake: FakeApiServer) -> None:
    seen: list[str] = []

    def start() -> None:
        kube = KubeApi.connect(server=fake.url)
        try:
            seen.append(tlsstore.ensure_ca(kube, NS, NOW).cert)
        finally:
            kube.close()

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(seen) == 4 and len(set(seen)) == 1
