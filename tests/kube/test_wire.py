"""The bind path's requests sent without lightkube's request building (``kube.wire``) are
the requests lightkube sent: the same method, path, query, headers and body (decoded), on
a server at the root or under a path prefix; names that are not Kubernetes names go
through lightkube as before; the answers are read as before."""

from __future__ import annotations

import logging
from typing import Any

import msgspec
import pytest
from gpupool_testing.fake_apiserver import FakeApiServer
from lightkube.config.kubeconfig import KubeConfig
from lightkube.config.models import Cluster, User

from gpupool.kube.api import KubeApi
from gpupool.kube.errors import KubeError, NotFound
from gpupool.kube.wire import Wire

from .rawhttp import Answer, RawServer, Request

STATUS = msgspec.json.encode({"kind": "Status", "apiVersion": "v1", "status": "Success",
                              "code": 201})
LEDGER = msgspec.json.encode({"apiVersion": "gpupool.io/v1alpha1", "kind": "GPULedger",
                              "metadata": {"name": "n-1.a", "resourceVersion": "7"},
                              "spec": {"entries": {}}})
# what a body may hold: non-ASCII text, floats, integers past 64 bits, nulls, nesting
ODD = {"spec": {"entries": {"u1": {"pod": "ns/pödé ✓", "share": 0.1 + 0.2, "big": 2 ** 70,
                                   "neg": -(2 ** 63), "none": None, "list": [1.5e300, "x"]}}}}
ANNOTATIONS = {"gpupool.io/allocation": '{"gpus":[{"uuid":"GPU-1","core":30}]}',
               "gpupool.io/note": "naïve ✓ \u2028 \"quoted\""}


def _calls(api: KubeApi) -> None:
    api.bind_pod("ns-1", "pod-a", "uid-1", "node-1.example", ANNOTATIONS)
    api.bind_pod("ns-1", "pod-b", "", "node-1", None)
    api.get_ledger("n-1.a")
    api.patch_ledger("n-1.a", ODD, "7")
    api.patch_ledger("n-1.a", {"spec": {"entries": {"u2": None}}}, None)


def _recorded(fast: bool, prefix: str = "") -> list[Request]:
    def answer(request: Request) -> Answer:
        return Answer(201, STATUS) if request.path.endswith("/binding") else Answer(200, LEDGER)

    with RawServer(answer) as server:
        config = KubeConfig.from_one(cluster=Cluster(server=server.url + prefix), user=User())
        api = KubeApi(config, trust_env=False)
        if not fast:
            api._wire = None
        try:
            _calls(api)
        finally:
            api.close()
        return list(server.requests)


def _seen(request: Request) -> tuple[str, str, str | None, Any]:
    body = msgspec.json.decode(request.body) if request.body else None
    return request.method, request.path, request.headers.get("content-type"), body


@pytest.mark.parametrize("prefix", ["", "/k8s/clusters/c-1"])
def test_the_bind_paths_requests_are_lightkubes(prefix: str) -> None:
    fast = _recorded(True, prefix)
    slow = _recorded(False, prefix)
    assert [_seen(r) for r in fast] == [_seen(r) for r in slow]
    assert len(fast) == 5
    binding = "/api/v1/namespaces/ns-1/pods/pod-a/binding?fieldManager=gpupool"
    assert fast[0].path == prefix + binding
    assert fast[2].path == prefix + "/apis/gpupool.io/v1alpha1/gpuledgers/n-1.a"
    # every header lightkube's request carried (authentication aside: none here)
    for f, s in zip(fast, slow, strict=True):
        assert set(f.headers) == set(s.headers)


def test_the_body_keeps_non_ascii_text_floats_and_big_integers() -> None:
    (patch,) = [r for r in _recorded(True) if r.method == "PATCH"][:1]
    sent = msgspec.json.decode(patch.body)
    assert sent["spec"] == ODD["spec"]
    assert sent["metadata"] == {"resourceVersion": "7"}


def test_a_lightkube_not_built_as_the_pinned_one_sends_everything_through_lightkube(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def other_lightkube(self: Wire, client: object) -> None:
        raise AttributeError("'GenericSyncClient' object has no attribute '_client'")

    fast = _recorded(True)
    monkeypatch.setattr(Wire, "__init__", other_lightkube)
    with caplog.at_level(logging.WARNING, logger="gpupool.kube.wire"):
        slow = _recorded(True)
    assert [_seen(r) for r in slow] == [_seen(r) for r in fast]
    assert "differs from the pinned ones" in caplog.text


def test_names_that_are_not_kubernetes_names_go_through_lightkube(fake: FakeApiServer,
                                                                  api: KubeApi) -> None:
    assert api._wire is not None
    assert api._wire.url(("api",), ("Pod_A",), write=True) is None
    assert api._wire.url(("api",), ("a/b",), write=True) is None
    assert api._wire.url(("api",), ("a?b",), write=False) is None
    assert api._wire.url(("api",), ("-a",), write=False) is None
    assert api._wire.url(("api",), ("a-1.b",), write=False) is not None
    with pytest.raises(NotFound):  # as lightkube answered it before
        api.bind_pod("default", "Pod_A", "", "n1")


def test_a_ledger_answer_that_is_not_an_object_is_a_kube_error() -> None:
    with RawServer(lambda r: Answer(200, b"[1, 2]")) as server:
        api = KubeApi.connect(server=server.url)
        try:
            with pytest.raises(KubeError, match="not what the API serves"):
                api.get_ledger("n1")
            with pytest.raises(KubeError, match="not what the API serves"):
                api.patch_ledger("n1", {"spec": {}}, "1")
        finally:
            api.close()
    with RawServer(lambda r: Answer(200, b"{not json")) as server:
        api = KubeApi.connect(server=server.url)
        try:
            with pytest.raises(KubeError, match="not what the API serves"):
                api.get_ledger("n1")
        finally:
            api.close()

