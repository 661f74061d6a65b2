"""The webhook over real HTTPS on loopback: AdmissionReview v1 bodies in and out, the
certificate trusted through the caBundle it wrote, renewed and reloaded in place."""

from __future__ import annotations

import base64
import json
import ssl
from pathlib import Path

import pytest
import trustme

from gpupool.kube.webhook_ops import WebhookApi
from gpupool.webhook.certificates import CertificateKeeper, ca_bundle
from gpupool.webhook.metrics import Metrics
from gpupool.webhook.review import Verdict
from gpupool.webhook.server import MAX_BODY_BYTES, HttpsServer, WebhookApp
from gpupool.webhook.tls import ServingTls

from .builders import body, container, gpu_pod, pod, review
from .conftest import HOST, NAMESPACE, SECRET, SETTINGS, Webhook, plan

FORGED = {"gpupool.io/allocation": '{"v":1,"node":"n1"}', "gpupool.io/node": "n1",
          "gpupool.io/phase": "allocating"}


def test_a_plain_pod_is_allowed_and_the_uid_is_echoed(webhook: Webhook) -> None:
    status, out = webhook.post("/validate", body(review(pod(), uid="abc-1")))
    assert status == 200
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    assert out["response"] == {"uid": "abc-1", "allowed": True}


def test_a_forged_decision_is_denied_with_a_message_a_person_can_act_on(
        webhook: Webhook) -> None:
    status, out = webhook.post("/validate", body(review(gpu_pod(annotations=FORGED, node="n1"))))
    assert status == 200
    response = out["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert "pod team-a/p: annotations gpupool.io/allocation, gpupool.io/node, gpupool.io/phase" \
        " are written by gpupool only" in response["status"]["message"]


def test_an_environment_override_is_denied(webhook: Webhook) -> None:
    c = container(limits={"gpupool.io/gpu-memory": "1024"},
                  env={"NVIDIA_VISIBLE_DEVICES": "all"})
    _, out = webhook.post("/validate", body(review(pod("p", "team-a", c))))
    assert out["response"]["allowed"] is False
    assert "sets NVIDIA_VISIBLE_DEVICES" in out["response"]["status"]["message"]


def test_a_gpu_pod_comes_back_patched_with_the_scheduler_and_the_implied_gpu(
        webhook: Webhook) -> None:
    _, out = webhook.post("/mutate", body(review(gpu_pod())))
    response = out["response"]
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    assert {"op": "add", "path": "/spec/schedulerName", "value": "gpupool-scheduler"} in ops
    assert {"op": "add", "path": "/spec/containers/0/resources/limits/gpupool.io~1gpu",
            "value": "1"} in ops
    assert {"op": "add", "path": "/spec/containers/0/resources/requests",
            "value": {"gpupool.io/gpu": "1"}} in ops
    sample = webhook.metrics.registry.get_sample_value(
        "gpupool_webhook_reviews_total",
        {"endpoint": "mutate", "resource": "pods", "operation": "CREATE", "outcome": "patched"})
    assert sample == 1.0


@pytest.mark.parametrize(("payload", "words"), [
    (b"{not json", "not JSON"),
    (b'{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{}}',
     "list only v1"),
    (b"\xff\xfe", "not JSON"),
])
def test_a_body_without_a_readable_request_gets_400_and_the_reason(
        webhook: Webhook, payload: bytes, words: str) -> None:
    status, out = webhook.post("/validate", payload)
    assert status == 400 and words in out["error"]


def test_a_review_with_a_uid_but_a_broken_request_is_denied_naming_the_field(
        webhook: Webhook) -> None:
    broken = review(pod())
    broken["request"]["object"] = ["not", "an", "object"]
    status, out = webhook.post("/validate", body(broken))
    assert status == 200 and out["response"]["allowed"] is False
    assert "request.object must be a JSON object" in out["response"]["status"]["message"]


def test_an_oversized_body_gets_413_and_the_server_keeps_answering(webhook: Webhook) -> None:
    status, out = webhook.post("/validate", b" " * (MAX_BODY_BYTES + 1))
    assert status == 413 and "larger than" in out["error"]
    assert webhook.get("/healthz") == (200, "ok")
    assert webhook.post("/validate", body(review(pod())))[1]["response"]["allowed"] is True


def test_a_rule_that_fails_denies_and_the_server_survives(tmp_path: Path) -> None:
    def broken(*_: object) -> Verdict:
        raise RuntimeError("bug")

    metrics = Metrics()
    app = WebhookApp(SETTINGS, metrics, lambda: True)
    code, out = app.decide("validate", broken, body(review(pod())))
    assert code == 200 and out["response"]["allowed"] is False
    assert out["response"]["status"]["code"] == 500
    assert metrics.registry.get_sample_value("gpupool_webhook_internal_errors_total",
                                             {"endpoint": "validate"}) == 1.0


def test_the_api_server_trusts_the_webhook_through_the_ca_bundle_it_wrote(
        webhook: Webhook) -> None:
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert "BEGIN CERTIFICATE" in webhook.bundle(kind)
    stranger = trustme.CA().cert_pem.bytes().decode()
    with pytest.raises(ssl.SSLCertVerificationError):
        webhook.connect(stranger)
    assert webhook.get("/readyz") == (200, "ok")


def test_a_renewed_certificate_is_served_from_the_next_connection_on(webhook: Webhook) -> None:
    before = webhook.connect()
    first = before.getpeercert(binary_form=True)
    webhook.fake.delete("secrets", SECRET, NAMESPACE)  # as if due: the next round re-issues
    webhook.keeper.refresh()
    after = webhook.connect()
    assert after.getpeercert(binary_form=True) != first
    assert webhook.metrics.registry.get_sample_value(
        "gpupool_webhook_certificate_reloads_total") == 2.0
    before.close()
    after.close()
    assert webhook.post("/validate", body(review(pod())))[1]["response"]["allowed"] is True


def test_a_new_ca_is_trusted_before_it_is_served_and_the_old_one_is_kept(
        webhook: Webhook) -> None:
    old_bundle = webhook.bundle()
    webhook.fake.delete("secrets", "gpupool-ca", NAMESPACE)
    webhook.keeper.refresh()
    new_bundle = webhook.bundle()
    assert new_bundle.count("BEGIN CERTIFICATE") == 2 and old_bundle.strip() in new_bundle
    assert webhook.post("/validate", body(review(pod())), new_bundle)[0] == 200
    with pytest.raises(ssl.SSLCertVerificationError):
        webhook.connect(old_bundle)


def test_a_bundle_keeps_at_most_the_new_ca_and_one_valid_old_one() -> None:
    cas = [trustme.CA().cert_pem.bytes().decode() for _ in range(3)]
    bundle = ""
    for ca in cas:
        bundle = ca_bundle(ca, bundle, 0.0)
    text = base64.b64decode(bundle).decode()
    assert text.count("BEGIN CERTIFICATE") == 2
    assert text.index(cas[2].strip()) < text.index(cas[1].strip()) and cas[0] not in text
    assert ca_bundle(cas[0], "%%% not base64", 0.0) == ca_bundle(cas[0], "", 0.0)
    expired = ca_bundle(cas[1], bundle, 1e11)  # year 5138: every old CA has expired
    assert base64.b64decode(expired).decode().count("BEGIN CERTIFICATE") == 1


def test_with_external_certificates_the_secret_is_served_as_it_is_and_the_bundle_left_alone(
        webhook: Webhook, tmp_path: Path) -> None:
    other = trustme.CA()
    leaf = other.issue_cert(HOST)
    webhook.fake.seed("secrets", {"metadata": {"name": "issued", "namespace": NAMESPACE},
                                  "type": "kubernetes.io/tls", "data": {
        "tls.crt": base64.b64encode(leaf.cert_chain_pems[0].bytes()).decode(),
        "tls.key": base64.b64encode(leaf.private_key_pem.bytes()).decode()}})
    bundle_before = webhook.bundle()
    external = plan(managed=False)
    external = type(external)(external.namespace, external.service, "issued",
                              external.configurations, managed=False)
    tls = ServingTls(tmp_path / "ext")
    api = WebhookApi.open(server=webhook.fake.url)
    try:
        CertificateKeeper(api, external, tls, lambda: 0.0, Metrics()).refresh()
        server = HttpsServer(WebhookApp(SETTINGS, Metrics(), lambda: True).app, tls,
                             "127.0.0.1", 0)
        port = server.start()
        try:
            probe = Webhook(webhook.fake, api, webhook.keeper, tls, Metrics(), port)
            status, _ = probe.post("/validate", body(review(pod())),
                                   other.cert_pem.bytes().decode())
            assert status == 200
        finally:
            server.stop()
    finally:
        api.close()
    assert webhook.bundle() == bundle_before
