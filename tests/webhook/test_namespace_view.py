"""The webhook's view of namespaces' placement labels, against the FAKE API server: kept by a
watch (no GET per review), following label changes; a namespace the watch has not shown is
read once; a namespace that cannot be read still gets well-formed answers."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Iterator
from contextlib import contextmanager

from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.core.request import Serving
from gpupool.kube.webhook_ops import WebhookApi
from gpupool.webhook.admission import mutate, validate
from gpupool.webhook.metrics import Metrics
from gpupool.webhook.namespaces import NamespaceView
from gpupool.webhook.placement import LABEL_DEFAULT, LABEL_MINIMUM, NamespacePlacement, Setting
from gpupool.webhook.server import WebhookApp
from tests.waiting import wait_for

from .builders import body, container, pod, review
from .test_namespace_placement import train
from .test_remote import settings


def namespace(name: str, labels: dict[str, str] | None = None) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": dict(labels or {})}}


@contextmanager
def watched(fake: FakeApiServer) -> Iterator[tuple[NamespaceView, WebhookApi]]:
    api = WebhookApi.open(server=fake.url)
    view = NamespaceView(api.with_timeout(2.0).get_namespace_labels)
    informer = view.informer(api, watch_timeout_s=5).start()
    try:
        assert view.synced.wait(30)
        yield view, api
    finally:
        informer.stop()
        api.close()


def gets_of(fake: FakeApiServer, name: str) -> int:
    return sum(1 for method, path in list(fake.requests)
               if method == "GET" and path == f"/api/v1/namespaces/{name}")


def test_the_view_follows_label_changes_and_reads_no_namespace_per_review() -> None:
    with FakeApiServer() as fake:
        fake.seed("namespaces", namespace("lab", {LABEL_DEFAULT: "remote-required"}))
        fake.seed("namespaces", namespace("free"))
        with watched(fake) as (view, _):
            assert view.placement_of("lab").default == Setting(Serving.REMOTE_REQUIRED)
            assert view.placement_of("free") == NamespacePlacement("free")
            fake.patch("namespaces", "lab", {"metadata": {"labels": {
                LABEL_DEFAULT: None, LABEL_MINIMUM: "remote-allowed"}}})
            assert wait_for(lambda: view.placement_of("lab") == NamespacePlacement(
                "lab", minimum=Setting(Serving.REMOTE_ALLOWED)))
            fake.patch("namespaces", "lab", {"metadata": {"labels": {LABEL_MINIMUM: "remote"}}})
            assert wait_for(lambda: view.placement_of("lab").minimum.broken)
            fake.patch("namespaces", "lab", {"metadata": {"labels": {LABEL_MINIMUM: None}}})
            assert wait_for(lambda: view.placement_of("lab") == NamespacePlacement("lab"))
            for _ in range(20):
                view.placement_of("lab")
            assert gets_of(fake, "lab") == 0


def test_a_namespace_the_watch_has_not_shown_is_read_once_per_review() -> None:
    with FakeApiServer() as fake:
        fake.seed("namespaces", namespace("new", {LABEL_MINIMUM: "remote-required"}))
        api = WebhookApi.open(server=fake.url)
        try:
            view = NamespaceView(api.get_namespace_labels)  # no watch: nothing shown yet
            assert view.placement_of("new").minimum == Setting(Serving.REMOTE_REQUIRED)
            assert gets_of(fake, "new") == 1
            gone = view.placement_of("absent")
            assert gone.unreadable == "there is no such namespace"
        finally:
            api.close()


def test_a_deleted_namespace_leaves_the_view() -> None:
    with FakeApiServer() as fake:
        fake.seed("namespaces", namespace("lab", {LABEL_DEFAULT: "remote-allowed"}))
        with watched(fake) as (view, _):
            fake.delete("namespaces", "lab")
            assert wait_for(lambda: view.placement_of("lab").unreadable != "")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_reviews_are_answered_when_no_namespace_can_be_read() -> None:
    api = WebhookApi.open(server=f"http://127.0.0.1:{closed_port()}")
    try:
        view = NamespaceView(api.with_timeout(2.0).get_namespace_labels)
        s = dataclasses.replace(settings(), namespaces=view.placement_of)
        app = WebhookApp(s, Metrics(), lambda: True)
        for path, obj, allowed in (
                ("mutate", train(), False), ("validate", train("local"), False),
                ("mutate", train("remote-required"), True),
                ("validate", pod("web", "lab", container()), True)):
            rule = mutate if path == "mutate" else validate
            code, out = app.decide(path, rule, body(review(obj, uid="u-7")))
            assert code == 200 and out["kind"] == "AdmissionReview"
            response = out["response"]
            assert (response["uid"], response["allowed"]) == ("u-7", allowed), response
            if not allowed:
                assert response["status"]["code"] == 503
                assert "gpupool cannot read namespace lab (get namespace lab:" in \
                    response["status"]["message"]
    finally:
        api.close()

