"""A small certificate authority for gpupool's own TLS (pure: time is passed in).

gpupool makes and rotates its own certificates so that an install works without
cert-manager (which may still supply them instead):

* the extender's serving certificate (kube-scheduler verifies it with the CA),
* the client certificate kube-scheduler presents to the extender (mutual TLS: the
  extender accepts only certificates this CA issued for ``CLIENT_SCHEDULER``),
* the admission webhook's serving certificate (the API server verifies it with the
  ``caBundle`` of the webhook configurations).

Keys are ECDSA P-256 (every TLS stack of Kubernetes speaks it; fast to make).
``PemPair`` is what a ``kubernetes.io/tls`` Secret holds (``tls.crt``, ``tls.key``,
and ``ca.crt``); ``renewal_due`` says when to issue again (a third of the lifetime
before expiry by default), so a rotation happens while the old certificate still works.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpupool.core.errors import InvalidInput

CA_DAYS = 3650
LEAF_DAYS = 365
RENEW_FRACTION = 1 / 3  # re-issue when this share of the lifetime is left
CLIENT_SCHEDULER = "system:gpupool:kube-scheduler"  # the scheduler's client certificate CN


class CertificateError(InvalidInput):
    """Certificate or key material that cannot be read or does not fit its use."""


@dataclass(frozen=True, slots=True)
class PemPair:
    """A certificate and its private key, PEM text (as a TLS Secret stores them)."""

    cert: str
    key: str

    def certificate(self) -> x509.Certificate:
        return load_certificate(self.cert)


def _at(now: float) -> datetime:
    return datetime.fromtimestamp(now, UTC)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _pem_cert(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def new_ca(common_name: str, now: float, days: int = CA_DAYS) -> PemPair:
    """A self-signed CA certificate valid from a minute before ``now`` for ``days``."""
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    start = _at(now) - timedelta(minutes=1)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(start + timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                         False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    return PemPair(_pem_cert(cert), _pem_key(key))


def issue(ca: PemPair, common_name: str, now: float, *, dns_names: Sequence[str] = (),
          client: bool = False, days: int = LEAF_DAYS, uris: Sequence[str] = (),
          lifetime_s: float | None = None) -> PemPair:
    """A leaf certificate signed by ``ca``: a server certificate for ``dns_names`` (or
    ``uris``), or a client certificate (``client=True``) whose subject is ``common_name``;
    ``uris`` are added as URI names (an identity such as ``spiffe://…``). It is valid for
    ``lifetime_s`` seconds from ``now`` when given, else for ``days``."""
    if not client and not dns_names and not uris:
        raise CertificateError(f"a server certificate for {common_name} needs DNS names or "
                               "URIs")
    ca_cert, ca_key = ca.certificate(), load_private_key(ca.key)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise CertificateError("the CA key is not an ECDSA key")
    key = _key()
    start = _at(now) - timedelta(minutes=1)
    life = timedelta(days=days) if lifetime_s is None else \
        timedelta(seconds=lifetime_s) + timedelta(minutes=1)
    end = min(start + life, ca_cert.not_valid_after_utc)
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
               .issuer_name(ca_cert.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(start).not_valid_after(end)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(True, False, True, False, False, False, False, False,
                                            False), critical=True)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                   ca_key.public_key()), critical=False))
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    names += [x509.UniformResourceIdentifier(u) for u in uris]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return PemPair(_pem_cert(builder.sign(ca_key, hashes.SHA256())), _pem_key(key))


def load_certificate(pem: str) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(pem.encode())
    except ValueError as exc:
        raise CertificateError(f"not a PEM certificate ({exc})") from None


def load_private_key(pem: str) -> object:
    try:
        return serialization.load_pem_private_key(pem.encode(), None)
    except (ValueError, TypeError) as exc:
        raise CertificateError(f"not a PEM private key ({exc})") from None


def renewal_due(pem: str, now: float, fraction: float = RENEW_FRACTION) -> bool:
    """True when less than ``fraction`` of the certificate's lifetime is left (or it is
    not yet valid, or unreadable: a certificate that cannot be used is due at once)."""
    try:
        cert = load_certificate(pem)
    except CertificateError:
        return True
    start, end = cert.not_valid_before_utc.timestamp(), cert.not_valid_after_utc.timestamp()
    return now < start or now > end - (end - start) * fraction


def covers(pem: str, dns_names: Sequence[str]) -> bool:
    """Whether the certificate names every one of ``dns_names``."""
    try:
        sans = load_certificate(pem).extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    except (CertificateError, x509.ExtensionNotFound):
        return False
    return set(dns_names) <= set(sans)


def signed_by(pem: str, ca_pem: str) -> bool:
    """Whether ``ca_pem``'s key signed the certificate ``pem``."""
    try:
        load_certificate(pem).verify_directly_issued_by(load_certificate(ca_pem))
    except (CertificateError, ValueError, TypeError, InvalidSignature):
        return False
    return True


def service_names(service: str, namespace: str) -> tuple[str, ...]:
    """The DNS names a Service is reached by inside the cluster."""
    return (service, f"{service}.{namespace}", f"{service}.{namespace}.svc",
            f"{service}.{namespace}.svc.cluster.local")
