"""Per-session credentials of remote GPU slices: who may reach a slice, and until when.

A remote slice is reached through two gpupool mutual-TLS terminators, the client
sidecar in the workload's pod and the slice server on the GPU node (``gpupool.remote``,
docs/remote.md). Both present certificates of gpupool's CA (``certs``):

* the sidecar a **client certificate bound to its pod**: the URI name
  ``spiffe://gpupool.io/pod/<pod uid>``, extended key usage ``clientAuth``, valid for
  ``SESSION_S`` (an hour) unless said otherwise — short-lived, so the control side
  issues the next one before it runs out and the sidecar picks it up (rotation);
* the slice server a **server certificate for the same pod**:
  ``spiffe://gpupool.io/slice-server/<pod uid>``, ``serverAuth``: a sidecar talks only to
  the server of its own slice, whatever address it was given.

The server accepts a session only from a certificate that names the pod its slice was
decided for, is a client certificate, is within its validity period and is not in the
**revocation list**: an X.509 CRL signed by the same CA (``revocation_list``), which
the control side rewrites when a slice is released or a credential leaks and the server
reads again when it changes (``revoked_serials`` checks its signature).

Pure: no I/O, time passed in (seconds since the epoch).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from gpupool.security.certs import (
    CertificateError,
    PemPair,
    issue,
    load_certificate,
    load_private_key,
)

SESSION_S = 3600.0
"""Default lifetime of a session credential (client and server)."""
CLIENT_PREFIX = "spiffe://gpupool.io/pod/"
SERVER_PREFIX = "spiffe://gpupool.io/slice-server/"
_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$")


def _checked(pod_uid: str) -> str:
    if not _UID.match(pod_uid):
        raise CertificateError(f"pod uid {pod_uid!r} is not a Kubernetes uid (letters, digits "
                               "and '-', at most 64)")
    return pod_uid


def client_uri(pod_uid: str) -> str:
    """The identity of the sidecar of pod ``pod_uid``."""
    return CLIENT_PREFIX + _checked(pod_uid)


def server_uri(pod_uid: str) -> str:
    """The identity of the slice server that serves pod ``pod_uid``'s slice."""
    return SERVER_PREFIX + _checked(pod_uid)


def issue_client(ca: PemPair, pod_uid: str, now: float,
                 lifetime_s: float = SESSION_S) -> PemPair:
    """The sidecar's session certificate for pod ``pod_uid``."""
    return issue(ca, f"gpupool-slice-client:{pod_uid}", now, client=True,
                 uris=[client_uri(pod_uid)], lifetime_s=lifetime_s)


def issue_server(ca: PemPair, pod_uid: str, now: float, lifetime_s: float = SESSION_S,
                 dns_names: Iterable[str] = ()) -> PemPair:
    """The slice server's certificate for pod ``pod_uid``'s slice."""
    return issue(ca, f"gpupool-slice-server:{pod_uid}", now, dns_names=list(dns_names),
                 uris=[server_uri(pod_uid)], lifetime_s=lifetime_s)


@dataclass(frozen=True, slots=True)
class Credential:
    """What a peer's certificate says about it."""

    uris: tuple[str, ...]
    serial: int
    not_before: float
    not_after: float
    client: bool
    server: bool

    def who(self) -> str:
        return ", ".join(self.uris) or "no gpupool identity"


def read_credential(der: bytes) -> Credential:
    """A peer certificate (DER, as TLS hands it over) as a ``Credential``."""
    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError as exc:
        raise CertificateError(f"not a DER certificate ({exc})") from None
    return _credential(cert)


def credential_of(pem: str) -> Credential:
    """A certificate (PEM, as a TLS Secret holds it) as a ``Credential``."""
    return _credential(load_certificate(pem))


def _credential(cert: x509.Certificate) -> Credential:
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = tuple(sans.get_values_for_type(x509.UniformResourceIdentifier))
    except x509.ExtensionNotFound:
        uris = ()
    try:
        usages = set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except x509.ExtensionNotFound:
        usages = set()
    return Credential(uris, cert.serial_number, cert.not_valid_before_utc.timestamp(),
                      cert.not_valid_after_utc.timestamp(),
                      ExtendedKeyUsageOID.CLIENT_AUTH in usages,
                      ExtendedKeyUsageOID.SERVER_AUTH in usages)


def refusal(peer: Credential, identity: str, now: float,
            revoked: frozenset[int] = frozenset(), *, client: bool = True) -> str | None:
    """Why ``peer`` may not hold a session as ``identity`` (a client, or with
    ``client=False`` a server) at ``now``; None when it may."""
    if identity not in peer.uris:
        return f"the certificate is for {peer.who()}, not {identity}"
    if not (peer.client if client else peer.server):
        return f"the certificate is not a {'client' if client else 'server'} certificate"
    if now >= peer.not_after:
        return f"the certificate expired at {iso(peer.not_after)}"
    if now < peer.not_before:
        return f"the certificate is not valid before {iso(peer.not_before)}"
    if peer.serial in revoked:
        return f"the certificate (serial {peer.serial:x}) is revoked"
    return None


def iso(t: float) -> str:
    """Seconds since the epoch as RFC 3339 (UTC, whole seconds)."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def revocation_list(ca: PemPair, serials: Iterable[int], now: float,
                    lifetime_s: float = 7 * 86400.0) -> str:
    """A CRL (PEM) signed by ``ca`` naming the certificate serials that are revoked."""
    ca_cert, ca_key = ca.certificate(), load_private_key(ca.key)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise CertificateError("the CA key is not an ECDSA key")
    at = datetime.fromtimestamp(now, UTC)
    builder = (x509.CertificateRevocationListBuilder().issuer_name(ca_cert.subject)
               .last_update(at).next_update(at + timedelta(seconds=lifetime_s)))
    for serial in sorted(set(serials)):
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(at).build())
    crl = builder.sign(ca_key, hashes.SHA256())
    return crl.public_bytes(serialization.Encoding.PEM).decode()


def revoked_serials(crl_pem: str, ca_pem: str) -> frozenset[int]:
    """The serials a CRL revokes, once its signature is checked against the CA."""
    try:
        crl = x509.load_pem_x509_crl(crl_pem.encode())
    except ValueError as exc:
        raise CertificateError(f"not a PEM revocation list ({exc})") from None
    ca = load_certificate(ca_pem)
    public = ca.public_key()
    if crl.issuer != ca.subject or not isinstance(public, ec.EllipticCurvePublicKey) or \
            not crl.is_signature_valid(public):
        raise CertificateError("the revocation list is not signed by gpupool's CA")
    return frozenset(r.serial_number for r in crl)
