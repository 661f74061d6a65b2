"""gpupool's own certificates in the cluster: one CA, leaf certificates made from it.

* Secret ``gpupool-ca`` (type Opaque: ``ca.crt``, ``ca.key``) in gpupool's namespace:
  the certificate authority. Readable only by the components that issue (the extender
  and the admission webhook). Remote slices' session certificates come from a CA of their
  own, ``gpupool-slice-ca``, which only the controller reads (``ensure_ca``'s ``name``).
* A leaf per use, as a ``kubernetes.io/tls`` Secret (``tls.crt``, ``tls.key``,
  ``ca.crt``): made when missing, and made again when it is due for renewal
  (``certs.renewal_due``), names other DNS names than wanted, or was not issued by the
  current CA. Components mount their Secret, or read it through ``read_pair``.

Every write is a create or a replace at the resourceVersion read, so replicas starting
together agree on one CA and one certificate (the loser of a race reads the winner's).
cert-manager can supply the same Secrets instead: a leaf that is valid, names the
wanted DNS names and is signed by the CA in its ``ca.crt`` is left alone.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from gpupool.kube.api import KubeApi
from gpupool.kube.errors import AlreadyExists, Conflict, KubeError, NotFound
from gpupool.security import certs
from gpupool.security.certs import PemPair

log = logging.getLogger(__name__)

CA_SECRET = "gpupool-ca"
ATTEMPTS = 5
TLS_TYPE = "kubernetes.io/tls"


@dataclass(frozen=True, slots=True)
class Leaf:
    """A certificate as a TLS Secret holds it, with the CA that issued it."""

    pair: PemPair
    ca_cert: str


def ensure_ca(kube: KubeApi, namespace: str, now: float, name: str = CA_SECRET) -> PemPair:
    """The CA in Secret ``name``, made on first use (and made again when due: leaves
    follow)."""
    for _ in range(ATTEMPTS):
        try:
            data, version = kube.get_secret_data(namespace, name)
        except NotFound:
            data, version = {}, ""
        ca = PemPair(data.get("ca.crt", ""), data.get("ca.key", ""))
        if ca.cert and ca.key and not certs.renewal_due(ca.cert, now, fraction=0.1):
            return ca
        fresh = certs.new_ca(name, now)
        try:
            kube.put_secret_data(namespace, name, {"ca.crt": fresh.cert,
                                                   "ca.key": fresh.key}, version or None)
        except (AlreadyExists, Conflict):
            continue
        log.info("made gpupool's certificate authority in Secret %s/%s", namespace, name)
        return fresh
    raise KubeError(f"Secret {namespace}/{name} kept changing while it was made")


def read_pair(kube: KubeApi, namespace: str, name: str) -> Leaf:
    """The certificate a TLS Secret holds; ``NotFound`` when it does not exist."""
    data, _ = kube.get_secret_data(namespace, name)
    return Leaf(PemPair(data.get("tls.crt", ""), data.get("tls.key", "")), data.get("ca.crt", ""))


def ensure_leaf(kube: KubeApi, namespace: str, name: str, ca: PemPair, common_name: str,
                now: float, *, dns_names: Sequence[str] = (), client: bool = False) -> Leaf:
    """The TLS Secret ``name`` holding a certificate for ``common_name`` (a client
    certificate, or a server one for ``dns_names``), issued or renewed as needed."""
    for _ in range(ATTEMPTS):
        try:
            data, version = kube.get_secret_data(namespace, name)
        except NotFound:
            data, version = {}, ""
        have = Leaf(PemPair(data.get("tls.crt", ""), data.get("tls.key", "")),
                    data.get("ca.crt", ""))
        if _usable(have, ca, dns_names, now):
            return have
        pair = certs.issue(ca, common_name, now, dns_names=dns_names, client=client)
        try:
            kube.put_secret_data(namespace, name, {"tls.crt": pair.cert, "tls.key": pair.key,
                                                   "ca.crt": ca.cert}, version or None, TLS_TYPE)
        except (AlreadyExists, Conflict):
            continue
        log.info("issued certificate %s (%s) into Secret %s/%s", common_name,
                 ", ".join(dns_names) or "client", namespace, name)
        return Leaf(pair, ca.cert)
    raise KubeError(f"Secret {namespace}/{name} kept changing while it was issued")


def _usable(leaf: Leaf, ca: PemPair, dns_names: Sequence[str], now: float) -> bool:
    if not leaf.pair.cert or not leaf.pair.key or certs.renewal_due(leaf.pair.cert, now):
        return False
    if dns_names and not certs.covers(leaf.pair.cert, dns_names):
        return False
    return certs.signed_by(leaf.pair.cert, ca.cert) and leaf.ca_cert == ca.cert
