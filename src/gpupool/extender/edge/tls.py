"""The extender's mutual TLS: its serving certificate, the CA whose client certificates it
accepts, where both come from, and how a new certificate takes effect without a restart.

* ``ServingMaterial``: the serving certificate chain and key (PEM) and the client CA.
* ``TlsSource``: where the material lives in the cluster. ``gpupool`` (the default):
  gpupool's own CA (Secret ``gpupool-ca``, ``kube.tlsstore.ensure_ca``), the extender's
  serving certificate for its Service's DNS names (a ``kubernetes.io/tls`` Secret), and
  the client certificate kube-scheduler presents (another such Secret, its subject
  ``certs.CLIENT_SCHEDULER``), each made when missing and issued again when due.
  ``secret``: the serving Secret is read as it is (``tls.crt``, ``tls.key``, ``ca.crt``:
  the CA of the scheduler's client certificate), for cert-manager or hand-made
  certificates; the extender writes nothing.
* ``ReloadingContext``: the listening ``SSLContext``. Each handshake is handed the
  context made from the newest material (``sni_callback``, which OpenSSL calls for every
  ClientHello, with or without a server name), so a renewed certificate or CA is used by
  the next connection; connections already open keep theirs.

The private key reaches OpenSSL through a file (Python's ``ssl`` loads keys only from
files): written into a fresh private temporary directory (mode 0700, file 0600),
loaded, and removed at once.
"""

from __future__ import annotations

import logging
import os
import ssl
import tempfile
from dataclasses import dataclass
from typing import Any

from gpupool.kube import tlsstore
from gpupool.kube.api import KubeApi
from gpupool.security import certs

log = logging.getLogger(__name__)

SERVING_SECRET = "gpupool-extender-tls"
CLIENT_SECRET = "gpupool-scheduler-client"
SERVICE = "gpupool-extender"


@dataclass(frozen=True, slots=True)
class ServingMaterial:
    cert: str
    key: str
    client_ca: str


def server_context(material: ServingMaterial) -> ssl.SSLContext:
    """A server context that presents ``material``'s certificate and requires a client
    certificate issued by its CA (TLS 1.2 at least)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cadata=material.client_ca)
    with tempfile.TemporaryDirectory(prefix="gpupool-tls-") as folder:
        cert, key = os.path.join(folder, "tls.crt"), os.path.join(folder, "tls.key")
        for path, text in ((cert, material.cert), (key, material.key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
        ctx.load_cert_chain(cert, key)
    return ctx


class ReloadingContext:
    """The listening context; handshakes use the context of the newest material."""

    def __init__(self, material: ServingMaterial):
        self.material = material
        self.current = server_context(material)
        self.listening = server_context(material)
        self.listening.sni_callback = self._pick

    def _pick(self, conn: Any, server_name: str | None, ctx: ssl.SSLContext) -> None:
        conn.context = self.current

    def update(self, material: ServingMaterial) -> bool:
        """Use ``material`` from the next handshake on; False when it is what is in use.
        Material that does not load raises ``ssl.SSLError`` and changes nothing."""
        if material == self.material:
            return False
        context = server_context(material)
        self.current, self.material = context, material
        return True


@dataclass(frozen=True, slots=True)
class TlsSource:
    """Where the extender's certificates live (``mode``: ``gpupool`` or ``secret``)."""

    namespace: str
    mode: str = "gpupool"
    serving_secret: str = SERVING_SECRET
    client_secret: str = CLIENT_SECRET
    service: str = SERVICE

    def material(self, kube: KubeApi, now: float) -> ServingMaterial:
        """The serving material as it should be now: made or renewed (``gpupool``), or as
        the Secret holds it (``secret``)."""
        if self.mode == "secret":
            leaf = tlsstore.read_pair(kube, self.namespace, self.serving_secret)
            return ServingMaterial(leaf.pair.cert, leaf.pair.key, leaf.ca_cert)
        ca = tlsstore.ensure_ca(kube, self.namespace, now)
        leaf = tlsstore.ensure_leaf(kube, self.namespace, self.serving_secret, ca, self.service,
                                    now, dns_names=certs.service_names(self.service,
                                                                       self.namespace))
        tlsstore.ensure_leaf(kube, self.namespace, self.client_secret, ca,
                             certs.CLIENT_SCHEDULER, now, client=True)
        return ServingMaterial(leaf.pair.cert, leaf.pair.key, ca.cert)

