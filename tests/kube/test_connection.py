"""What ``KubeApi`` keeps through lightkube and httpx: rotated service account tokens,
watches that end when the server goes quiet or the API is closed, TCP keep-alive, the
environment's proxy, and every failure as the ``gpupool.kube.errors`` tree."""

from __future__ import annotations

import ast
import json
import os
import select
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
from gpupool_testing.fake_apiserver import FakeApiServer
from httpcore2._backends.sync import SyncStream
from lightkube.config.kubeconfig import KubeConfig
from lightkube.config.models import Cluster, User, UserExec

from gpupool.kube import connection
from gpupool.kube.api import KubeApi
from gpupool.kube.connection import ApiTransport, proxy_for
from gpupool.kube.errors import AlreadyExists, Conflict, KubeError, NotFound
from tests.waiting import wait_for

from .rawhttp import Answer, RawServer, Request
from .test_api import pod


def ledger(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"node": name, "entries": {}}}


def config_for(url: str, **user: Any) -> KubeConfig:
    return KubeConfig.from_one(cluster=Cluster(server=url), user=User(**user))


# -- service account tokens -------------------------------------------------------------------
def test_a_rotated_token_file_is_read_again_when_the_server_rejects_the_old_token(
        fake: FakeApiServer, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("one\n")
    fake.require_token("one")
    api = KubeApi(config_for(fake.url, token_file=str(token)), trust_env=False)
    try:
        api.create_ledger(ledger("n1"))
        token.write_text("two\n")  # the kubelet writes the new token...
        fake.require_token("two")  # ...and the old one expires
        rv = api.get_ledger("n1")["metadata"]["resourceVersion"]
        api.patch_ledger("n1", {"spec": {"entries": {"u": {"pod": "a"}}}}, rv)
        assert fake.unauthorized == 1  # the old token once, then the file was read again
        assert set(fake.get("gpuledgers", "n1")["spec"]["entries"]) == {"u"}
        token.write_text("three\n")
        fake.require_token("three")
        watch = api.watch_ledgers(rv, timeout_s=5)
        kind, obj = next(watch)  # a watch opened after a rotation is answered too
        assert (kind, sorted(obj["spec"]["entries"])) == ("MODIFIED", ["u"])
        assert fake.unauthorized == 2
    finally:
        api.close()


def test_a_token_the_server_rejects_is_a_kube_error_with_code_401(
        fake: FakeApiServer, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("stale")
    fake.require_token("fresh")
    api = KubeApi(config_for(fake.url, token_file=str(token)), trust_env=False)
    try:
        with pytest.raises(KubeError, match=r"^get GPULedger n1: Unauthorized") as e:
            api.get_ledger("n1")
        assert e.value.code == 401
        assert fake.unauthorized == 2  # the file was read again once, to no avail
    finally:
        api.close()


def test_a_static_token_is_sent(fake: FakeApiServer) -> None:
    fake.require_token("s3cret")
    api = KubeApi(config_for(fake.url, token="s3cret"), trust_env=False)
    try:
        api.create_ledger(ledger("n1"))
        assert fake.unauthorized == 0
    finally:
        api.close()


def test_a_missing_token_file_is_a_kube_error(tmp_path: Path) -> None:
    api = KubeApi(config_for("http://127.0.0.1:9", token_file=str(tmp_path / "none")),
                  trust_env=False)
    with pytest.raises(KubeError, match=r"^get GPULedger n1: Token file .*none not found"):
        api.get_ledger("n1")
    api.close()


def test_an_exec_credential_plugin_and_basic_auth_reach_the_server(
        fake: FakeApiServer) -> None:
    credential = {"apiVersion": "client.authentication.k8s.io/v1beta1",
                  "kind": "ExecCredential", "status": {"token": "from-plugin"}}
    plugin = UserExec(apiVersion="client.authentication.k8s.io/v1beta1",
                      command=sys.executable,
                      args=["-c", f"print({json.dumps(json.dumps(credential))})"])
    fake.require_token("from-plugin")
    api = KubeApi(config_for(fake.url, exec=plugin), trust_env=False)
    try:
        api.create_ledger(ledger("n1"))
    finally:
        api.close()
    seen: list[str] = []
    with RawServer(lambda r: (seen.append(r.headers.get("authorization", "")), Answer())[1]
                   ) as server:
        basic = KubeApi(config_for(server.url, username="admin", password="pw"),
                        trust_env=False)
        basic.get_ledger("n1")
        basic.close()
    assert seen == ["Basic YWRtaW46cHc="]


def test_an_auth_provider_is_refused_at_the_start() -> None:
    config = config_for("http://127.0.0.1:9", auth_provider={"name": "oidc"})
    with pytest.raises(KubeError, match=r"^connect to the Kubernetes API: auth-provider not "
                       "supported"):
        KubeApi(config, trust_env=False)


# -- watches -----------------------------------------------------------------------------------
def quiet_after_one_event(r: Request) -> Answer:
    """A watch answered with its head and one event; then the server says nothing more
    while the connection stays open (a hung API server, or a proxy in front of a dead one)."""
    line = b'{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"6"}}}\n'
    return Answer(raw=b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(line), line))


def test_a_watch_ends_when_the_server_stops_answering_mid_stream() -> None:
    with RawServer(quiet_after_one_event) as server:
        api = KubeApi(config_for(server.url), timeout_s=0.5, trust_env=False,
                      watch_margin_s=0.5)
        seen = []
        start = time.monotonic()
        with pytest.raises(KubeError, match=r"^watch GPULedgers: ReadTimeout: nothing arrived "
                           r"for 1.5 s on a watch the server was asked to end after 1 s"):
            for kind, obj in api.watch_ledgers("5", timeout_s=1):
                seen.append((kind, obj["metadata"]["name"]))
        waited = time.monotonic() - start
        api.close()
    assert seen == [("ADDED", "a")]
    assert 1.4 < waited < 30  # it ends (a loaded machine may notice the silence late)
    assert "timeoutSeconds=1" in server.requests[0].path


def watching(fake: FakeApiServer, plural: str) -> bool:
    """Whether a watch of ``plural`` is open on the fake API server."""
    with fake.store.lock:
        return any(w.plural == plural for w in fake.store.listeners)


def test_a_watch_that_the_server_ends_goes_on_from_the_last_version_seen(
        fake: FakeApiServer, api: KubeApi) -> None:
    rv = api.list_ledgers().resource_version
    watch = api.watch_ledgers(rv, timeout_s=1)
    api.create_ledger(ledger("n1"))
    assert next(watch)[0] == "ADDED"
    # the server ends that request after the second it was given; lightkube opens the next
    assert wait_for(lambda: not watching(fake, "gpuledgers"))
    api.create_ledger(ledger("n2"))
    kind, obj = next(watch)
    assert (kind, obj["metadata"]["name"]) == ("ADDED", "n2")
    watches = [p for m, p in fake.requests if m == "GET" and p.endswith("/gpuledgers")]
    assert len(watches) >= 3  # the list, then two watch requests


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
    assert wait_for(lambda: watching(fake, "gpuledgers"))  # blocked on the quiet stream
    api.close()
    t.join(30)
    assert not t.is_alive()
    assert isinstance(ended[0], KubeError) and "closed" in str(ended[0])


def test_a_broken_watch_stream_is_a_kube_error() -> None:
    body = b'{"type":"ADDED","object":{"metadata":{"name":"a"}}}\nnot json\n'
    with RawServer(lambda r: Answer(body=body)) as server:
        api = KubeApi.connect(server=server.url)
        seen = []
        with pytest.raises(KubeError, match=r"^watch GPULedgers: the answer is not what the "
                           "API serves"):
            for kind, obj in api.watch_ledgers("5", timeout_s=1):
                seen.append((kind, obj["metadata"]["name"]))
        assert seen == [("ADDED", "a")]
        assert "resourceVersion=5" in server.requests[0].path
        assert "watch=true" in server.requests[0].path
        api.close()


def test_closing_frees_no_descriptor_a_reader_is_about_to_wait_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The race under ``close``: a watch reader has looked its socket's descriptor up and
    is about to wait on it (``recv`` does both with the interpreter lock let go) when
    another thread closes the API. Were the descriptor freed then, the next connection
    opened would take its number, and the reader would wait on, and read, that other
    connection. The real socket stream's read is paused between the look-up and the
    wait; the number must still name the reader's own socket, shut down, and the reader
    must end at once."""
    looked_up, resume = threading.Event(), threading.Event()
    numbers: list[int] = []
    read = SyncStream.read

    def paused_read(stream: SyncStream, max_bytes: int, timeout: float | None = None
                    ) -> bytes:
        number = stream.get_extra_info("socket").fileno()  # what recv looks up...
        numbers.append(number)
        looked_up.set()
        resume.wait(30)
        ready, _, _ = select.select([number], [], [], timeout)  # ...and waits on
        return os.read(number, max_bytes) if ready else b""

    with RawServer(quiet_after_one_event) as server:
        transport = ApiTransport.for_config(config_for(server.url).get(), 1.0,
                                            trust_env=False)
        client = httpx2.Client(transport=transport, base_url=server.url)
        response = client.send(client.build_request(
            "GET", "/apis/gpupool.io/v1alpha1/gpuledgers?watch=true&timeoutSeconds=30"),
            stream=True)
        own = response.extensions["network_stream"].get_extra_info("socket")
        identity = os.fstat(own.fileno()).st_ino
        monkeypatch.setattr(SyncStream, "read", paused_read)
        ended: list[bytes | BaseException] = []

        def reader() -> None:
            try:
                ended.append(b"".join(response.iter_raw()))
            except httpx2.HTTPError as exc:  # the assertion below says what
                ended.append(exc)

        thread = threading.Thread(target=reader)
        thread.start()
        try:
            assert looked_up.wait(30)
            transport.close()  # another thread closes the API...
            other, peer = socket.socketpair()  # ...and the next connection is opened
            with other, peer:
                peer.sendall(b"bytes of another connection")
                assert os.fstat(numbers[0]).st_ino == identity  # still the reader's socket
                resume.set()
                thread.join(30)
                assert not thread.is_alive()
                assert other.recv(100) == b"bytes of another connection"  # not read by it
        finally:
            resume.set()
            monkeypatch.setattr(SyncStream, "read", read)
        client.close()
    assert isinstance(ended[0], httpx2.ReadError) and "closed" in str(ended[0])
    assert own.fileno() == -1  # the reader let go: its connection is closed


# -- connections -------------------------------------------------------------------------------
def test_connections_keep_tcp_keep_alive_on(fake: FakeApiServer) -> None:
    transport = ApiTransport.for_config(config_for(fake.url).get(), 1.0, trust_env=False)
    with httpx2.Client(transport=transport, base_url=fake.url) as client, \
            client.stream("GET", "/apis/gpupool.io/v1alpha1/gpuledgers") as response:
        sock = response.extensions["network_stream"].get_extra_info("socket")
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        if hasattr(socket, "TCP_KEEPIDLE"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == \
                connection.KEEPALIVE_IDLE_S
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == \
                connection.KEEPALIVE_INTERVAL_S
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == \
                connection.KEEPALIVE_PROBES


def clear_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("NO_PROXY", "ALL_PROXY", "HTTPS_PROXY", "HTTP_PROXY"):
        monkeypatch.delenv(var, raising=False)
        monkeypatch.delenv(var.lower(), raising=False)


def test_the_environment_names_the_proxy_unless_no_proxy_exempts_the_server(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clear_proxies(monkeypatch)
    assert proxy_for("https://10.1.2.3:6443") is None
    monkeypatch.setenv("HTTPS_PROXY", "proxy.example:3128")
    monkeypatch.setenv("HTTP_PROXY", "http://plain.example:80")
    assert proxy_for("https://10.1.2.3:6443") == "http://proxy.example:3128"
    assert proxy_for("http://10.1.2.3:6443") == "http://plain.example:80"
    monkeypatch.setenv("NO_PROXY", "example.com,10.1.2.3")
    assert proxy_for("https://10.1.2.3:6443") is None
    assert proxy_for("https://api.example.com") is None
    assert proxy_for("https://api.example.org") == "http://proxy.example:3128"


def nobody_listening() -> int:
    """A port on 127.0.0.1 that nothing listens on (connecting is refused at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_calls_go_through_the_environments_proxy_unless_told_not_to_trust_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clear_proxies(monkeypatch)
    server = f"http://127.0.0.1:{nobody_listening()}"  # no name to resolve: no DNS read
    with RawServer(lambda r: Answer()) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        api = KubeApi(config_for(server), timeout_s=2)
        api.get_ledger("n1")
        api.close()
        assert proxy.requests[0].path == f"{server}/apis/gpupool.io/v1alpha1/gpuledgers/n1"
        direct = KubeApi(config_for(server), timeout_s=2, trust_env=False)
        with pytest.raises(KubeError, match=r"^get GPULedger n1: ConnectError"):
            direct.get_ledger("n1")
        direct.close()
        assert len(proxy.requests) == 1


# -- the error tree ----------------------------------------------------------------------------
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


@pytest.mark.parametrize(("answer", "message"), [
    (Answer(502, b"bad gateway", {"Content-Type": "text/plain"}), "HTTP 502: bad gateway"),
    (Answer(503, b"", {}), "HTTP 503"),
    (Answer(409, b'{"kind":"Status","reason":"Conflict","message":"the object was modified"}',
            {}), "the object was modified"),
    (Answer(500, b'{"unexpected": true}'), "HTTP 500"),
], ids=["text", "no body", "a Status without its Content-Type", "JSON that is not a Status"])
def test_an_error_answer_that_is_not_a_status_still_says_what_failed(
        answer: Answer, message: str) -> None:
    with RawServer(lambda r: answer) as server:
        api = KubeApi.connect(server=server.url)
        with pytest.raises(KubeError, match=rf"^get GPULedger n1: {message}$") as e:
            api.get_ledger("n1")
        assert e.value.code == answer.status
        assert isinstance(e.value, Conflict) == (answer.status == 409)
        api.close()


def test_a_list_answer_that_is_not_a_list_is_a_kube_error() -> None:
    with RawServer(lambda r: Answer(body=b'{"items": 7}')) as server:
        api = KubeApi.connect(server=server.url)
        with pytest.raises(KubeError, match=r"^list GPULedgers: the answer is not what the API "
                           "serves"):
            api.list_ledgers()
        api.close()


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


def test_nothing_listening_is_a_kube_error_with_code_zero() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    api = KubeApi.connect(server=url, timeout_s=2)
    with pytest.raises(KubeError, match=r"^bind pod default/a to n1: ConnectError: ") as e:
        api.bind_pod("default", "a", "", "n1")
    assert e.value.code == 0
    api.close()


def test_a_server_that_never_answers_is_named_with_the_time_waited_and_the_step() -> None:
    with socket.socket() as silent:  # accepts connections (the kernel does), says nothing
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"https://127.0.0.1:{silent.getsockname()[1]}"
        api = KubeApi.connect(server=url, timeout_s=0.5)
        with pytest.raises(KubeError) as e:
            api.list_gpu_devices()
        api.close()
    assert str(e.value) == (f"list GPUDevices: no answer from {url} within 0.5 s "
                            "(connecting, TLS handshake included)")
    assert e.value.code == 0


def test_a_closed_api_refuses_calls(fake: FakeApiServer) -> None:
    api = KubeApi.connect(server=fake.url)
    api.close()
    with pytest.raises(KubeError, match=r"^get GPULedger n1: .*closed"):
        api.get_ledger("n1")
    assert ("GET", "/apis/gpupool.io/v1alpha1/gpuledgers/n1") not in fake.requests


def test_threads_share_one_api(fake: FakeApiServer, api: KubeApi) -> None:
    api.create_ledger(ledger("n1"))
    errors: list[BaseException] = []

    def reads() -> None:
        try:
            for _ in range(20):
                assert api.get_ledger("n1")["metadata"]["name"] == "n1"
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=reads) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sum(1 for m, p in fake.requests if p.endswith("/gpuledgers/n1")) == 80


# -- one client path ---------------------------------------------------------------------------
CLIENTS = ("httpx", "httpx2", "httpcore", "httpcore2", "http.client", "urllib3", "requests",
           "aiohttp", "urllib.request")  # lightkube is the client: only gpupool.kube imports it


def test_only_the_kube_api_and_its_transport_import_an_http_client() -> None:
    src = Path(__file__).resolve().parents[2] / "src" / "gpupool"
    found = set()
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(m == c or m.startswith(c + ".") for m in modules for c in CLIENTS):
                found.add(str(path.relative_to(src)))
    # httpx under lightkube, no other Kubernetes client; the node agent reads the slice
    # servers' own status port (/usage of remote slices, not the Kubernetes API)
    assert found == {"kube/api.py", "kube/connection.py", "kube/wire.py",
                     "nodeagent/slices.py"}
