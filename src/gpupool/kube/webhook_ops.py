"""The Kubernetes calls the admission webhook needs beyond ``KubeApi``'s, on the same client.

``WebhookApi`` reads a Mutating/ValidatingWebhookConfiguration as plain JSON and
writes its ``webhooks`` back (a JSON merge patch carrying the ``resourceVersion``
read, so a configuration edited in between answers ``Conflict`` and is read again):
the webhook keeps the ``caBundle`` of its own entries equal to gpupool's CA. It reads one
namespace's labels (``get_namespace_labels``) for a review whose namespace its watch has not
shown yet, on a client whose requests give up sooner (``with_timeout``) than the API
server's call to the webhook does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightkube.resources.admissionregistration_v1 import (
    MutatingWebhookConfiguration,
    ValidatingWebhookConfiguration,
)
from lightkube.resources.core_v1 import Namespace
from lightkube.types import PatchType

from gpupool.kube.api import KubeApi, KubeObject
from gpupool.kube.api import _translated as translated

CONFIGURATION_KINDS: dict[str, Any] = {
    "MutatingWebhookConfiguration": MutatingWebhookConfiguration,
    "ValidatingWebhookConfiguration": ValidatingWebhookConfiguration,
}


class WebhookApi(KubeApi):
    """``KubeApi`` plus reading and patching webhook configurations."""

    @classmethod
    def open(cls, kubeconfig: str | None = None, server: str | None = None,
             timeout_s: float = 10.0) -> WebhookApi:
        api = cls.connect(kubeconfig, server, timeout_s)
        assert isinstance(api, WebhookApi)  # connect builds ``cls``
        return api

    def get_webhook_configuration(self, kind: str, name: str) -> KubeObject:
        """The configuration as plain JSON (``NotFound`` when it does not exist)."""
        with translated(f"get {kind} {name}"):
            obj = self.client.get(CONFIGURATION_KINDS[kind], name)
        result: KubeObject = obj.to_dict()
        return result

    def patch_webhook_configuration(self, kind: str, name: str,
                                    webhooks: Sequence[KubeObject], resource_version: str
                                    ) -> None:
        """Replace the ``webhooks`` list, only if the configuration is still at
        ``resource_version`` (else ``Conflict``)."""
        body = {"metadata": {"resourceVersion": resource_version}, "webhooks": list(webhooks)}
        with translated(f"update {kind} {name}"):
            self.client.patch(CONFIGURATION_KINDS[kind], name, body,
                              patch_type=PatchType.MERGE)

    def with_timeout(self, timeout_s: float) -> WebhookApi:
        """A new connection pool like ``fork``'s whose requests time out after
        ``timeout_s``."""
        api = type(self).__new__(type(self))
        api._open(self._config, timeout_s, self._trust_env, self._watch_margin_s, self._tls)
        return api

    def get_namespace_labels(self, name: str) -> dict[str, str]:
        """The labels of namespace ``name`` (``NotFound`` when there is none)."""
        with translated(f"get namespace {name}"):
            ns = self.client.get(Namespace, name)
        return dict(ns.metadata.labels or {}) if ns.metadata is not None else {}
