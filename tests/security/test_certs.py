"""gpupool's own certificate authority: issue, check, renew."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from pathlib import Path

import pytest

from gpupool.security import certs

NOW = 1_800_000_000.0
DAY = 86400.0


def test_a_server_certificate_names_its_service_and_is_signed_by_the_ca() -> None:
    ca = certs.new_ca("gpupool-ca", NOW)
    names = certs.service_names("gpupool-extender", "gpupool-system")
    server = certs.issue(ca, "gpupool-extender", NOW, dns_names=names)
    assert certs.covers(server.cert, names)
    assert not certs.covers(server.cert, ["evil.example"])
    assert certs.signed_by(server.cert, ca.cert)
    assert not certs.signed_by(server.cert, certs.new_ca("other", NOW).cert)


def test_a_server_certificate_without_names_is_refused() -> None:
    with pytest.raises(certs.CertificateError, match="needs DNS names"):
        certs.issue(certs.new_ca("ca", NOW), "x", NOW)


def test_renewal_falls_due_in_the_last_third_of_the_lifetime() -> None:
    ca = certs.new_ca("ca", NOW)
    leaf = certs.issue(ca, "c", NOW, client=True, days=30)
    assert not certs.renewal_due(leaf.cert, NOW + 19 * DAY)
    assert certs.renewal_due(leaf.cert, NOW + 21 * DAY)
    assert certs.renewal_due(leaf.cert, NOW - DAY)  # not yet valid
    assert certs.renewal_due("garbage", NOW)


def test_a_leaf_never_outlives_its_ca() -> None:
    ca = certs.new_ca("ca", NOW, days=10)
    leaf = certs.issue(ca, "c", NOW, client=True, days=365)
    assert leaf.certificate().not_valid_after_utc <= ca.certificate().not_valid_after_utc


def test_mutual_tls_handshake_with_issued_certificates(tmp_path: Path) -> None:
    """The issued pair works in a real TLS handshake, both ways (stdlib ssl)."""
    now = time.time()  # a real handshake checks validity against the real clock
    ca = certs.new_ca("ca", now)
    server = certs.issue(ca, "srv", now, dns_names=["localhost"])
    client = certs.issue(ca, certs.CLIENT_SCHEDULER, now, client=True)
    for name, pair in (("server", server), ("client", client)):
        (tmp_path / f"{name}.crt").write_text(pair.cert)
        (tmp_path / f"{name}.key").write_text(pair.key)
    (tmp_path / "ca.crt").write_text(ca.cert)
    sctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=tmp_path / "ca.crt")
    sctx.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    sctx.verify_mode = ssl.CERT_REQUIRED
    cctx = ssl.create_default_context(cafile=tmp_path / "ca.crt")
    cctx.load_cert_chain(tmp_path / "client.crt", tmp_path / "client.key")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    seen: list[object] = []

    def serve() -> None:
        conn, _ = listener.accept()
        with sctx.wrap_socket(conn, server_side=True) as tls:
            seen.append(tls.getpeercert())
            tls.sendall(b"ok")

    t = threading.Thread(target=serve)
    t.start()
    with socket.create_connection(("127.0.0.1", port)) as raw, \
            cctx.wrap_socket(raw, server_hostname="localhost") as tls:
        assert tls.recv(2) == b"ok"
    t.join(30)
    listener.close()
    subject = dict(x[0] for x in seen[0]["subject"])  # type: ignore[index]
    assert subject["commonName"] == certs.CLIENT_SCHEDULER
