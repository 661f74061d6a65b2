"""The webhook's certificate: made, renewed, served, and trusted by the API server.

Two ways (``CertificatePlan.managed``):

* managed (the default): gpupool's CA (``kube.tlsstore.ensure_ca``) issues the serving
  certificate for the Service's DNS names into a TLS Secret (``ensure_leaf``, renewed
  a third of its lifetime before expiry), and the CA goes into the ``caBundle`` of the
  webhook's entries in its Mutating/ValidatingWebhookConfiguration. The bundle is
  written *before* a certificate from a new CA is served, and keeps the previous CA
  while it is valid, so that neither replica is ever distrusted during a rotation.
* external (cert-manager or another issuer): the certificate is read from the TLS
  Secret as it is, and the ``caBundle`` is left to whoever fills it (cert-manager's
  CA injector).

``CertificateKeeper.refresh`` does one round (every ``--check-seconds``): a renewed
Secret is served from the next TLS handshake on (``tls.ServingTls``).
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpupool.core.errors import InvalidInput
from gpupool.kube import tlsstore
from gpupool.kube.errors import KubeError, NotFound
from gpupool.kube.webhook_ops import WebhookApi
from gpupool.security import certs
from gpupool.webhook.metrics import Metrics
from gpupool.webhook.tls import ServingTls

log = logging.getLogger(__name__)

_PEM = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)
MAX_BUNDLE_CAS = 2


@dataclass(frozen=True, slots=True)
class CertificatePlan:
    """Where the certificate lives and who must trust it."""

    namespace: str
    service: str
    secret: str
    configurations: tuple[tuple[str, str], ...]  # (kind, name) of the webhook configurations
    managed: bool = True
    extra_dns_names: tuple[str, ...] = ()

    @property
    def dns_names(self) -> tuple[str, ...]:
        return (*certs.service_names(self.service, self.namespace), *self.extra_dns_names)


def ca_bundle(ca_pem: str, current_b64: str, now: float) -> str:
    """The ``caBundle`` (base64 of PEM) trusting ``ca_pem`` first, then the CAs the current
    bundle holds that are still valid (at most ``MAX_BUNDLE_CAS`` in all)."""
    try:
        current = base64.b64decode(current_b64 or "", validate=True).decode()
    except (binascii.Error, ValueError, UnicodeDecodeError):
        current = ""
    kept = [ca_pem.strip()]
    for block in _PEM.findall(current):
        if len(kept) >= MAX_BUNDLE_CAS or block.strip() in kept:
            continue
        try:
            end = certs.load_certificate(block).not_valid_after_utc.timestamp()
        except certs.CertificateError:
            continue
        if end > now:
            kept.append(block.strip())
    return base64.b64encode(("\n".join(kept) + "\n").encode()).decode()


class CertificateKeeper:
    """Keeps the served certificate and the configurations' ``caBundle`` current."""

    def __init__(self, api: WebhookApi, plan: CertificatePlan, tls: ServingTls,
                 clock: Callable[[], float], metrics: Metrics):
        self.api, self.plan, self.tls, self.clock, self.metrics = api, plan, tls, clock, metrics

    def refresh(self) -> None:
        """One round; ``KubeError``/``InvalidInput`` when a step could not be done."""
        ns, now = self.plan.namespace, self.clock()
        if not self.plan.managed:
            leaf = tlsstore.read_pair(self.api, ns, self.plan.secret)
        else:
            ca = tlsstore.ensure_ca(self.api, ns, now)
            self.publish_bundle(ca.cert)
            leaf = tlsstore.ensure_leaf(self.api, ns, self.plan.secret, ca,
                                        f"{self.plan.service}.{ns}.svc", now,
                                        dns_names=self.plan.dns_names)
        self._serve(leaf.pair)

    def _serve(self, pair: certs.PemPair) -> None:
        try:
            fresh = self.tls.install(pair.cert, pair.key)
        except (OSError, ValueError) as exc:
            raise InvalidInput(f"Secret {self.plan.namespace}/{self.plan.secret} holds no "
                               f"usable certificate and key ({exc})") from None
        if fresh:
            cert = pair.certificate()
            self.metrics.reloads.inc()
            self.metrics.not_after.set(cert.not_valid_after_utc.timestamp())
            log.info("serving certificate %s (valid until %s) from Secret %s/%s",
                     cert.subject.rfc4514_string(), cert.not_valid_after_utc.isoformat(),
                     self.plan.namespace, self.plan.secret)

    def publish_bundle(self, ca_pem: str) -> None:
        """Make every entry of the configurations that calls this Service trust ``ca_pem``."""
        for kind, name in self.plan.configurations:
            try:
                obj = self.api.get_webhook_configuration(kind, name)
            except NotFound:
                log.warning("%s %s does not exist (apply deploy/webhook/webhooks.yaml): no "
                            "caBundle written", kind, name)
                continue
            webhooks, changed = self._with_bundle(obj.get("webhooks") or [], ca_pem)
            if changed:
                version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
                self.api.patch_webhook_configuration(kind, name, webhooks, version)
                self.metrics.bundle_writes.inc()
                log.info("%s %s: caBundle of %d webhooks now trusts gpupool's CA", kind, name,
                         changed)

    def _with_bundle(self, webhooks: Sequence[dict[str, object]], ca_pem: str
                     ) -> tuple[list[dict[str, object]], int]:
        out, changed = [], 0
        for hook in webhooks:
            hook = dict(hook)
            client = dict(hook.get("clientConfig") or {})  # type: ignore[call-overload]
            svc = client.get("service") or {}
            if svc.get("name") == self.plan.service and \
                    svc.get("namespace") == self.plan.namespace:
                want = ca_bundle(ca_pem, str(client.get("caBundle") or ""), self.clock())
                if client.get("caBundle") != want:
                    client["caBundle"], changed = want, changed + 1
                    hook["clientConfig"] = client
            out.append(hook)
        return out, changed

    def run(self, stop: threading.Event, every_s: float, retry_s: float = 10.0) -> None:
        """Refresh until ``stop``: every ``every_s``, or ``retry_s`` after a failure."""
        while not stop.is_set():
            try:
                self.refresh()
                wait = every_s
            except (KubeError, InvalidInput) as exc:
                log.warning("certificate round failed (retried in %.0f s): %s", retry_s, exc)
                wait = retry_s
            stop.wait(wait)
