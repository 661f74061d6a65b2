"""The lean transport of ``KubeApi``'s hot calls: which calls take it, how answers map to
errors, dropped kept-alive connections, rotating tokens, and which configurations it
leaves to lightkube."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer
from lightkube.config.kubeconfig import KubeConfig
from lightkube.config.models import Cluster, User, UserExec

from gpupool.kube.api import KubeApi
from gpupool.kube.errors import AlreadyExists, Conflict, KubeError, NotFound

from .rawhttp import Answer, RawServer, Request
from .test_api import pod


def ledger(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"node": name, "entries": {}}}


class NoLightkube:
    """Stands in for the lightkube client: any use of it fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"lightkube's {name} was used")


def test_binds_and_ledger_writes_take_the_lean_path(fake: FakeApiServer, api: KubeApi) -> None:
    assert api.lean is not None
    uid = fake.seed("pods", pod("a"))["metadata"]["uid"]
    real, api.client = api.client, NoLightkube()  # type: ignore[assignment]
    try:
        created = api.create_ledger(ledger("n1"))
        rv = created["metadata"]["resourceVersion"]
        patched = api.patch_ledger("n1", {"spec": {"entries": {"u1": {"pod": "a"}}}}, rv)
        assert api.get_ledger("n1") == patched
        api.bind_pod("default", "a", uid, "n1", {"gpupool.io/phase": "allocating"})
    finally:
        api.client = real
    assert api.lean.sent == 4
    assert created["kind"] == "GPULedger" and created["apiVersion"] == "gpupool.io/v1alpha1"
    assert fake.get("pods", "a", "default")["spec"]["nodeName"] == "n1"
    assert ("POST", "/api/v1/namespaces/default/pods/a/binding") in fake.requests


def test_lists_take_the_lean_path_and_read_the_same_objects(fake: FakeApiServer,
                                                              api: KubeApi) -> None:
    for name in ("a", "b"):
        fake.seed("pods", pod(name))
    slow = KubeApi.connect(server=fake.url, lean=False)
    try:
        expected = slow.list_pod_summaries()
        real, api.client = api.client, NoLightkube()  # type: ignore[assignment]
        try:
            listed = api.list_pod_summaries()
        finally:
            api.client = real
    finally:
        slow.close()
    assert [p.metadata.name for p in listed.items] == ["a", "b"]
    assert listed.items == expected.items and listed.resource_version == \
        expected.resource_version != ""


def test_a_paged_list_follows_the_continue_tokens() -> None:
    pages = iter([b'{"metadata":{"resourceVersion":"7","continue":"p2"},"items":['
                  b'{"metadata":{"name":"a"}}]}',
                  b'{"metadata":{"resourceVersion":"7"},"items":[{"metadata":{"name":"b"}}]}'])
    with RawServer(lambda r: Answer(body=next(pages))) as server:
        api = KubeApi.connect(server=server.url)
        listed = api.list_ledgers()
        assert [obj["metadata"]["name"] for obj in listed.items] == ["a", "b"]
        assert listed.resource_version == "7"
        path = "/apis/gpupool.io/v1alpha1/gpuledgers"
        assert [r.path for r in server.requests] == [path, path + "?continue=p2"]
        api.close()


def test_a_list_answer_that_is_not_a_list_is_a_kube_error() -> None:
    with RawServer(lambda r: Answer(body=b'{"items": 7}')) as server:
        api = KubeApi.connect(server=server.url)
        with pytest.raises(KubeError, match="list GPULedgers: the answer is not a list"):
            api.list_ledgers()
        api.close()


def test_without_the_lean_flag_every_call_goes_through_lightkube(fake: FakeApiServer) -> None:
    api = KubeApi.connect(server=fake.url, lean=False)
    try:
        assert api.lean is None
        assert api.fork().lean is None
        uid = fake.seed("pods", pod("a"))["metadata"]["uid"]
        api.bind_pod("default", "a", uid, "n1")
        assert fake.get("pods", "a", "default")["spec"]["nodeName"] == "n1"
    finally:
        api.close()


def test_answers_map_to_the_error_tree_with_what_was_attempted(fake: FakeApiServer,
                                                               api: KubeApi) -> None:
    uid = fake.seed("pods", pod("a"))["metadata"]["uid"]
    api.bind_pod("default", "a", uid, "n1")
    with pytest.raises(Conflict, match=r"^bind pod default/a to n2: .*already assigned") as c:
        api.bind_pod("default", "a", uid, "n2")
    assert c.value.code == 409
    with pytest.raises(NotFound, match=r"^get GPULedger nowhere: ") as nf:
        api.get_ledger("nowhere")
    assert nf.value.code == 404 and nf.value.reason == "NotFound"
    api.create_ledger(ledger("n1"))
    with pytest.raises(AlreadyExists, match=r"^create GPULedger n1: "):
        api.create_ledger(ledger("n1"))
    with pytest.raises(Conflict, match=r"^update GPULedger n1: "):
        api.patch_ledger("n1", {"spec": {"entries": {}}}, "1")
    with pytest.raises(NotFound):
        api.patch_ledger("nowhere", {"spec": {"entries": {}}}, None)


def test_an_answer_that_is_not_a_status_still_says_what_failed() -> None:
    with RawServer(lambda r: Answer(502, b"bad gateway", {"Content-Type": "text/plain"})
                   ) as server:
        api = KubeApi.connect(server=server.url)
        with pytest.raises(KubeError, match=r"^get GPULedger n1: HTTP 502: bad gateway") as e:
            api.get_ledger("n1")
        assert e.value.code == 502
        api.close()


def test_nothing_listening_is_a_kube_error_with_code_zero() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    api = KubeApi.connect(server=url, timeout_s=2)
    with pytest.raises(KubeError, match=r"^bind pod default/a to n1: ConnectionRefusedError") as e:
        api.bind_pod("default", "a", "", "n1")
    assert e.value.code == 0
    api.close()


def test_a_closed_api_refuses_calls(fake: FakeApiServer) -> None:
    api = KubeApi.connect(server=fake.url)
    api.close()
    with pytest.raises(KubeError, match="closed"):
        api.get_ledger("n1")


# -- kept-alive connections ------------------------------------------------------------------
def test_a_connection_the_server_closed_while_idle_is_replaced() -> None:
    with RawServer(lambda r: Answer(close_after=True)) as server:
        api = KubeApi.connect(server=server.url)
        for _ in range(3):
            assert api.get_ledger("n1") == {}
        assert server.connections == 3
        assert len(server.requests) == 3  # nothing sent twice
        api.close()


def test_a_request_dropped_on_a_reused_connection_is_sent_once_more() -> None:
    seen = []

    def handler(r: Request) -> Answer:
        seen.append(r.path)
        return Answer(drop=len(seen) == 2)  # the second request: the connection just ends

    with RawServer(handler) as server:
        api = KubeApi.connect(server=server.url)
        api.get_ledger("a")
        api.get_ledger("b")
        assert seen[-2:] == [seen[1], seen[1]] and seen[1].endswith("/gpuledgers/b")
        assert server.connections == 2
        api.close()


def test_a_request_dropped_on_a_new_connection_is_an_error() -> None:
    with RawServer(lambda r: Answer(drop=True)) as server:
        api = KubeApi.connect(server=server.url)
        with pytest.raises(KubeError, match=r"^get GPULedger a: RemoteDisconnected"):
            api.get_ledger("a")
        assert len(server.requests) == 1
        api.close()


def test_each_thread_keeps_its_own_connection(fake: FakeApiServer, api: KubeApi) -> None:
    api.create_ledger(ledger("n1"))
    errors: list[BaseException] = []

    def reads() -> None:
        try:
            for _ in range(20):
                api.get_ledger("n1")
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=reads) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert api.lean is not None and api.lean.sent == 81


# -- bearer tokens ---------------------------------------------------------------------------
def token_config(url: str, **user: Any) -> KubeConfig:
    return KubeConfig.from_one(cluster=Cluster(server=url), user=User(**user))


def authorised(expected: list[str]) -> RawServer:
    """Answers 200 to the token in ``expected[0]`` (changeable), 401 to any other."""
    def handler(r: Request) -> Answer:
        ok = r.headers.get("authorization") == f"Bearer {expected[0]}"
        return Answer() if ok else Answer(401, b'{"kind":"Status","code":401,'
                                               b'"reason":"Unauthorized","message":"no"}')
    return RawServer(handler)


def test_a_static_token_is_sent() -> None:
    with authorised(["s3cret"]) as server:
        api = KubeApi(token_config(server.url, token="s3cret\n"), trust_env=False)
        assert api.lean is not None
        api.get_ledger("n1")
        api.close()
        wrong = KubeApi(token_config(server.url, token="wrong"), trust_env=False)
        with pytest.raises(KubeError, match=r"^get GPULedger n1: no") as e:
            wrong.get_ledger("n1")
        assert e.value.code == 401
        wrong.close()


@contextlib.contextmanager
def token_file_client(tmp_path: Path, text: str
                      ) -> Iterator[tuple[Path, list[str], RawServer, KubeApi]]:
    """A token file holding ``text``, a server that accepts its token (``expected[0]``,
    changeable), and a client that has made one call with it."""
    token = tmp_path / "token"
    token.write_text(text)
    expected = [text.strip()]
    with authorised(expected) as server:
        api = KubeApi(token_config(server.url, token_file=str(token)), trust_env=False)
        api.get_ledger("n1")
        yield token, expected, server, api
        api.close()


def test_a_token_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    with token_file_client(tmp_path, "one\n") as (token, expected, server, api):
        expected[0] = "two"
        token.write_text("two\n")
        os.utime(token, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
        api.get_ledger("n1")
        assert [r.headers["authorization"] for r in server.requests] == [
            "Bearer one", "Bearer two"]


def test_a_401_reads_the_token_file_again_even_if_it_looks_unchanged(tmp_path: Path) -> None:
    with token_file_client(tmp_path, "one") as (token, expected, server, api):
        stamp = token.stat()
        with open(token, "r+") as f:  # same inode, size and modification time
            f.write("two")
        os.utime(token, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
        expected[0] = "two"
        api.get_ledger("n1")
        assert [r.headers["authorization"] for r in server.requests] == [
            "Bearer one", "Bearer one", "Bearer two"]


def test_a_missing_token_file_is_a_kube_error(tmp_path: Path) -> None:
    with authorised(["x"]) as server:
        api = KubeApi(token_config(server.url, token_file=str(tmp_path / "none")),
                      trust_env=False)
        with pytest.raises(KubeError, match=r"^get GPULedger n1: token file"):
            api.get_ledger("n1")
        api.close()


def test_lightkube_is_set_up_only_when_a_call_needs_it(fake: FakeApiServer) -> None:
    api = KubeApi.connect(server=fake.url)
    api.create_ledger(ledger("n1"))  # a lean call
    assert api._client is None  # no lightkube client (nor its TLS context) was made
    fake.seed("pods", pod("a"))
    assert api.get_pod("default", "a").metadata.name == "a"  # a call that takes lightkube
    assert api._client is not None
    api.close()


def test_a_lightkube_call_after_close_fails_like_any_call_on_a_closed_client(
        fake: FakeApiServer) -> None:
    api = KubeApi.connect(server=fake.url)
    api.close()  # before lightkube was ever needed
    with pytest.raises(KubeError, match=r"^get pod default/a: "):
        api.get_pod("default", "a")
    assert ("GET", "/api/v1/namespaces/default/pods/a") not in fake.requests


# -- what stays on lightkube -------------------------------------------------------------------
@pytest.mark.parametrize("user", [
    User(exec=UserExec(apiVersion="client.authentication.k8s.io/v1beta1", command="true")),
    User(username="admin", password="pw"),
    User(auth_provider={"name": "oidc"}),
], ids=["an exec plugin", "basic auth", "an auth-provider"])
def test_credentials_it_cannot_reproduce_leave_every_call_to_lightkube(user: User) -> None:
    config = KubeConfig.from_one(cluster=Cluster(server="http://127.0.0.1:9"), user=user)
    if user.auth_provider:  # lightkube refuses it outright
        with pytest.raises(Exception, match="auth-provider"):
            KubeApi(config, trust_env=False)
        return
    assert KubeApi(config, trust_env=False).lean is None


def test_a_proxy_from_the_environment_leaves_every_call_to_lightkube(
        monkeypatch: pytest.MonkeyPatch) -> None:
    config = KubeConfig.from_one(cluster=Cluster(server="http://10.1.2.3:6443"), user=User())
    for var in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTPS_PROXY",
                "https_proxy"):
        monkeypatch.delenv(var, raising=False)
    assert KubeApi(config).lean is not None
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    assert KubeApi(config).lean is None
    assert KubeApi(config, trust_env=False).lean is not None
    monkeypatch.setenv("NO_PROXY", "10.1.2.3")
    assert KubeApi(config).lean is not None


# -- watches -----------------------------------------------------------------------------------
def test_a_watch_blocked_on_a_quiet_stream_ends_when_the_api_is_closed(
        fake: FakeApiServer) -> None:
    api = KubeApi.connect(server=fake.url)
    rv = api.list_ledgers().resource_version
    ended: list[BaseException | None] = []

    def watch() -> None:
        try:
            for _ in api.watch_ledgers(rv, timeout_s=30):
                pass
            ended.append(None)
        except BaseException as exc:  # the assertion below says what
            ended.append(exc)

    t = threading.Thread(target=watch)
    t.start()
    time.sleep(0.3)
    api.close()
    t.join(5)
    assert not t.is_alive()
    assert isinstance(ended[0], KubeError) and "closed" in str(ended[0])


def test_a_broken_watch_stream_is_a_kube_error() -> None:
    body = b'{"type":"ADDED","object":{"metadata":{"name":"a"}}}\nnot json\n'
    with RawServer(lambda r: Answer(body=body)) as server:
        api = KubeApi.connect(server=server.url)
        seen = []
        with pytest.raises(KubeError, match=r"^watch GPULedgers: an event that is not"):
            for kind, obj in api.watch_ledgers("5", timeout_s=1):
                seen.append((kind, obj["metadata"]["name"]))
        assert seen == [("ADDED", "a")]
        assert "resourceVersion=5" in server.requests[0].path
        assert "watch=true" in server.requests[0].path
        api.close()
