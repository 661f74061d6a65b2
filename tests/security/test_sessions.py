"""Per-session credentials of remote slices: bound to a pod, short-lived, revocable."""

from __future__ import annotations

import ssl

import pytest

from gpupool.security import certs, sessions

NOW = 1_800_000_000.0
UID = "0c5d7a7e-1d1b-4c3e-9a8f-5b9d2a6f7e01"
OTHER = "9f3e1b2a-0000-4c3e-9a8f-5b9d2a6f7e02"


def der(pem: str) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem)


@pytest.fixture(scope="module")
def ca() -> certs.PemPair:
    return certs.new_ca("gpupool-ca", NOW)


def test_a_client_credential_names_its_pod_and_lives_as_long_as_asked(
        ca: certs.PemPair) -> None:
    pair = sessions.issue_client(ca, UID, NOW, lifetime_s=600)
    peer = sessions.read_credential(der(pair.cert))
    assert peer.uris == (f"spiffe://gpupool.io/pod/{UID}",) and peer.client and not peer.server
    assert peer.not_after == pytest.approx(NOW + 600, abs=1)
    assert certs.signed_by(pair.cert, ca.cert)
    assert sessions.refusal(peer, sessions.client_uri(UID), NOW) is None


@pytest.mark.parametrize(("uid", "now", "revoked", "why"), [
    (OTHER, NOW, frozenset(), "is for spiffe://gpupool.io/pod/" + UID),
    (UID, NOW + 601, frozenset(), "expired at"),
    (UID, NOW - 3600, frozenset(), "not valid before"),
    (UID, NOW, None, "is revoked"),
])
def test_a_credential_is_refused_for_another_pod_when_expired_early_or_revoked(
        ca: certs.PemPair, uid: str, now: float, revoked: frozenset[int] | None,
        why: str) -> None:
    pair = sessions.issue_client(ca, UID, NOW, lifetime_s=600)
    peer = sessions.read_credential(der(pair.cert))
    if revoked is None:
        revoked = frozenset({peer.serial})
    refusal = sessions.refusal(peer, sessions.client_uri(uid), now, revoked)
    assert refusal is not None and why in refusal


def test_a_server_credential_is_no_client_credential_and_names_the_slice_server(
        ca: certs.PemPair) -> None:
    peer = sessions.read_credential(der(sessions.issue_server(ca, UID, NOW).cert))
    assert peer.server and not peer.client
    assert sessions.refusal(peer, sessions.server_uri(UID), NOW, client=False) is None
    assert "not a client certificate" in (sessions.refusal(
        sessions.read_credential(der(sessions.issue_server(ca, UID, NOW).cert)),
        sessions.server_uri(UID), NOW) or "")


def test_a_pod_uid_that_is_no_uid_is_refused(ca: certs.PemPair) -> None:
    with pytest.raises(certs.CertificateError, match="not a Kubernetes uid"):
        sessions.issue_client(ca, "a/../b", NOW)


def test_the_revocation_list_is_read_only_when_the_ca_signed_it(ca: certs.PemPair) -> None:
    crl = sessions.revocation_list(ca, [7, 9, 7], NOW)
    assert sessions.revoked_serials(crl, ca.cert) == {7, 9}
    other = certs.new_ca("gpupool-ca", NOW)  # the same name, another key
    with pytest.raises(certs.CertificateError, match="not signed by gpupool's CA"):
        sessions.revoked_serials(sessions.revocation_list(other, [7], NOW), ca.cert)
    with pytest.raises(certs.CertificateError, match="not a PEM revocation list"):
        sessions.revoked_serials("garbage", ca.cert)
