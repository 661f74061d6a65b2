"""The slice server and the client sidecar on loopback, over mutual TLS, with the STUB
provider as a real process: the data path, credentials, heartbeats and release."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import struct
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path

import pytest

from gpupool.remote.channel import Timing, hello
from gpupool.remote.client import ClientConfig, SliceClient
from gpupool.remote.credentials import Credentials
from gpupool.remote.frames import PREFIX, encode
from gpupool.remote.listening import TlsListener
from gpupool.remote.provider import (
    Isolation,
    ProviderError,
    ProviderProcess,
    ProviderSpec,
    pinned_env,
    stub_argv,
)
from gpupool.remote.server import ServerConfig, SliceServer
from gpupool.remote.stubclient import StubClient, StubRefused
from tests.ports import free_port
from tests.waiting import wait_for

from .builders import GPU, MIB, OTHER_UID, POD_UID, Authority, paths, slice_spec
from .loops import LoopThread, loop_thread

FAST = Timing(interval_s=0.1, deadline_s=0.6)


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    with loop_thread() as lt:
        yield lt


@pytest.fixture
def authority(tmp_path: Path) -> Authority:
    return Authority(tmp_path)


def start_server(loop: LoopThread, authority: Authority, revocations: Path | None = None,
                 connect_deadline_s: float = 60.0, memory_mib: int = 1) -> SliceServer:
    spec = slice_spec(memory_mib)
    port = free_port()
    provider = ProviderProcess(ProviderSpec(stub_argv(port, spec),
                                            pinned_env(os.environ, spec, Isolation()), port))
    config = ServerConfig(spec, "127.0.0.1", 0, paths(authority.server(), revocations), FAST,
                          connect_deadline_s, stub_usage=True)
    server = loop.call(lambda: SliceServer(config, provider))
    loop.run(server.start())
    return server


def start_client(loop: LoopThread, server: SliceServer, credentials: Path,
                 uid: str = POD_UID) -> SliceClient:
    return run_client(loop, server, credentials, uid)[0]


def run_client(loop: LoopThread, server: SliceServer, credentials: Path,
               uid: str = POD_UID) -> tuple[SliceClient, Future[str]]:
    config = ClientConfig(uid, "127.0.0.1", server.port, paths(credentials), "127.0.0.1", 0,
                          FAST, wait_s=60.0, retry_s=0.05)
    client = loop.call(lambda: SliceClient(config))
    return client, loop.submit(client.run())


def stop(loop: LoopThread, server: SliceServer) -> None:
    loop.run(server.release("the test ended"))


def test_a_workload_reaches_its_slice_through_both_terminators_and_no_further(
        loop: LoopThread, authority: Authority) -> None:
    server = start_server(loop, authority)
    try:
        client = start_client(loop, server, authority.client())
        assert wait_for(client.ready), client.status()
        with StubClient("127.0.0.1", client.port) as workload:
            assert workload.hello()["device"] == GPU  # pinned: CUDA_VISIBLE_DEVICES
            h = workload.alloc(MIB - 10)
            workload.write(h, b"over TLS", offset=100)
            assert workload.read(h, 8, offset=100) == b"over TLS"
            with pytest.raises(StubRefused, match="out-of-memory"):
                workload.alloc(11)  # one byte beyond the 1 MiB slice
            assert workload.usage()["memory_bytes"] == MIB - 10
        assert wait_for(lambda: server.usage_records()[0]["memory_mib"] == 1)
        record = server.usage_records()[0]
        assert record["pod_uid"] == POD_UID and record["gpu_uuid"] == GPU
        assert record["memory_limit_mib"] == 1 and record["core_limit_pct"] == 10
        assert server.status()["sessions"]["control"] == 1
    finally:
        stop(loop, server)


@pytest.mark.parametrize(("make", "why"), [
    (lambda a: a.client(uid=OTHER_UID, name="other"), "is for spiffe://gpupool.io/pod/" +
     OTHER_UID),
    (lambda a: a.client(issued_s_ago=7200, lifetime_s=3600, name="expired"),
     "certificate has expired"),
    (lambda a: a.foreign_client(), "unable to get local issuer certificate"),
    (lambda a: a.server(name="server-as-client"), "unsuitable certificate purpose"),
], ids=["another pod's", "an expired one", "another CA's", "a server certificate"])
def test_a_sidecar_with_credentials_not_for_this_slice_is_refused(
        loop: LoopThread, authority: Authority, make: object, why: str) -> None:
    server = start_server(loop, authority)
    try:
        credentials = make(authority)  # type: ignore[operator]
        client = start_client(loop, server, credentials)
        assert wait_for(lambda: client.state == "refused"), client.status()
        with contextlib.suppress(ssl.SSLError, OSError), tls_to(server, credentials) as sock:
            sock.sendall(encode(hello("control")))  # what the server says to it, directly
            answer = answer_of(sock)
            assert answer is None or answer["ok"] is False
        assert wait_for(lambda: any(why in r["reason"] for r in server.status()["refusals"])), \
            server.status()["refusals"]
        assert server.status()["sessions"] == {"data": 0, "control": 0}
        assert not client.ready()
    finally:
        stop(loop, server)


def test_a_revoked_credential_loses_its_open_session_and_cannot_come_back(
        loop: LoopThread, authority: Authority, tmp_path: Path) -> None:
    crl = authority.revoke(tmp_path / "revoked.crl")
    server = start_server(loop, authority, revocations=crl)
    try:
        credentials = authority.client()
        client = start_client(loop, server, credentials)
        assert wait_for(client.ready)
        authority.revoke(crl, authority.serial(credentials))
        assert wait_for(lambda: client.state == "refused"), client.status()
        assert "revoked" in client.reason
        assert any("revoked" in r["reason"] for r in server.status()["refusals"])
        assert server.state == "serving"  # the slice waits for a good credential
    finally:
        stop(loop, server)


def test_the_sidecar_refuses_a_server_that_is_not_its_pods_slice_server(
        loop: LoopThread, authority: Authority) -> None:
    server = start_server(loop, authority)
    try:
        # a sidecar of another pod, whose server would be OTHER_UID's: this server is not
        client = start_client(loop, server, authority.client(uid=OTHER_UID, name="o"),
                              uid=OTHER_UID)
        assert wait_for(lambda: client.state == "refused")
        assert "not this pod's slice server" in client.reason
        assert f"not spiffe://gpupool.io/slice-server/{OTHER_UID}" in client.reason
    finally:
        stop(loop, server)


def test_a_client_gone_past_its_deadline_releases_the_slice_and_nothing_is_held(
        loop: LoopThread, authority: Authority) -> None:
    server = start_server(loop, authority)
    client, running = run_client(loop, server, authority.client())
    assert wait_for(client.ready)
    with StubClient("127.0.0.1", client.port) as workload:
        workload.alloc(4096)
    stub_pid = server.provider.pid
    assert stub_pid is not None
    running.cancel()  # the sidecar is gone: no heartbeats, no goodbye
    assert wait_for(lambda: server.state == "released"), server.status()
    assert "no heartbeat from the client" in server.reason
    assert server.usage_records()[0]["memory_mib"] == 0
    assert not Path(f"/proc/{stub_pid}").exists() or _zombie(stub_pid)
    with pytest.raises(OSError):
        StubClient("127.0.0.1", server.provider.spec.port, timeout_s=2)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def test_a_slice_whose_client_never_connects_is_released(
        loop: LoopThread, authority: Authority) -> None:
    server = start_server(loop, authority, connect_deadline_s=0.3)
    assert wait_for(lambda: server.state == "released")
    assert server.reason == "no client connected within 0.3 s"


def test_a_watch_round_that_fails_does_not_stop_the_watch(
        loop: LoopThread, authority: Authority) -> None:
    """A revocation file that cannot be read as expected (a bug's way in) is said, and the
    deadlines and revocations are still watched: the slice is released when due."""
    server = start_server(loop, authority, connect_deadline_s=60.0)
    calls = []

    def broken() -> None:
        calls.append(1)
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "not UTF-8")
    server.credentials.refresh = broken  # type: ignore[method-assign]
    assert wait_for(lambda: len(calls) >= 2)  # one failed round, and the watch went on
    server.config = replace(server.config, connect_deadline_s=0.0)
    assert wait_for(lambda: server.state == "released")
    assert server.reason.startswith("no client connected within")


def test_a_provider_that_cannot_start_is_a_clear_error_and_nothing_runs(
        loop: LoopThread, authority: Authority, tmp_path: Path) -> None:
    spec = slice_spec()
    cases = [(("/nonexistent/provider",), "cannot start the provider '/nonexistent/provider'"),
             (("/bin/sh", "-c", "exit 3"), "exited with 3 before it listened"),
             (("/bin/sh", "-c", "sleep 30"), "did not listen on 127.0.0.1:")]
    for argv, why in cases:
        provider = ProviderProcess(ProviderSpec(argv, dict(os.environ), free_port(), 0.5))
        config = ServerConfig(spec, "127.0.0.1", 0, paths(authority.server()), FAST)
        server = loop.call(lambda c=config, p=provider: SliceServer(c, p))  # type: ignore[misc]
        with pytest.raises(ProviderError, match=why):
            loop.run(server.start())
        assert provider.proc is None or provider.proc.returncode is not None


def test_an_open_session_whose_certificate_expires_is_closed_and_cannot_come_back(
        loop: LoopThread, authority: Authority) -> None:
    server = start_server(loop, authority)
    try:
        client = start_client(loop, server, authority.client(lifetime_s=2.0))
        assert wait_for(client.ready)
        assert wait_for(lambda: client.state == "refused", timeout_s=20), client.status()
        assert "certificate expired at" in client.reason
        assert server.status()["sessions"] == {"data": 0, "control": 0}
    finally:
        stop(loop, server)


def tls_to(server: SliceServer, credentials: Path) -> ssl.SSLSocket:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(str(credentials / "ca.crt"))
    ctx.load_cert_chain(str(credentials / "tls.crt"), str(credentials / "tls.key"))
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    return ctx.wrap_socket(raw)


def answer_of(sock: ssl.SSLSocket) -> dict[str, object] | None:
    data = b""
    while len(data) < PREFIX.size:
        chunk = sock.recv(PREFIX.size - len(data))
        if not chunk:
            return None
        data += chunk
    head, _ = PREFIX.unpack(data)
    body = b""
    while len(body) < head:
        body += sock.recv(head - len(body))
    return json.loads(body)  # type: ignore[no-any-return]


@pytest.mark.parametrize(("sent", "why"), [
    (struct.pack("!II", 10**6, 0), "frame-too-large"),
    (struct.pack("!II", 5, 0) + b"nope!", "malformed-frame"),
    (encode({"op": "alloc", "size": 1}), "the first frame must be a hello"),
    (encode({"op": "hello", "protocol": 1, "channel": "debug"}), "unknown channel 'debug'"),
    (encode({"op": "hello", "protocol": 9, "channel": "data"}), "protocol 9 is not spoken"),
], ids=["oversized", "not JSON", "no hello", "unknown channel", "unknown protocol"])
def test_a_bad_hello_is_answered_and_closed_and_the_slice_serves_on(
        loop: LoopThread, authority: Authority, sent: bytes, why: str) -> None:
    server = start_server(loop, authority)
    try:
        with tls_to(server, authority.client()) as sock:
            sock.sendall(sent)
            answer = answer_of(sock)
            assert answer is not None and answer["ok"] is False
            assert why in str(answer["error"]) + str(answer["message"]), answer
            assert answer_of(sock) is None  # closed
        for junk in (b"GET / HTTP/1.1\r\n\r\n", b"\x16\x03\x01" + bytes(200), b""):
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
                s.sendall(junk)
        client = start_client(loop, server, authority.client(name="good"))
        assert wait_for(client.ready)
        assert server.state == "serving" and server.status()["refused_total"] >= 3
    finally:
        stop(loop, server)


def test_a_silent_tls_client_is_cut_off_after_the_handshake_time(
        loop: LoopThread, authority: Authority) -> None:
    spec = slice_spec()
    port = free_port()
    provider = ProviderProcess(ProviderSpec(stub_argv(port, spec), dict(os.environ), port))
    config = ServerConfig(spec, "127.0.0.1", 0, paths(authority.server()), FAST,
                          handshake_s=0.3)
    server = loop.call(lambda: SliceServer(config, provider))
    loop.run(server.start())
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            assert s.recv(1) == b""  # closed by the server, no handshake ever began
        assert wait_for(lambda: any("TLS handshake failed: SSL handshake is taking longer"
                                    in r["reason"] for r in server.status()["refusals"])), \
            server.status()["refusals"]
    finally:
        stop(loop, server)


def test_connections_that_never_finish_their_handshake_hold_a_bounded_number_of_slots(
        loop: LoopThread, authority: Authority) -> None:
    refused: list[str] = []

    async def never(*_: object) -> None:
        raise AssertionError("no handshake can finish here")

    creds = Credentials(paths(authority.server()), server=True)
    listener = TlsListener(lambda: creds.context, never,
                           lambda peer, exc: refused.append(str(exc)), handshake_s=30,
                           max_handshakes=2)
    loop.run(listener.start("127.0.0.1", 0, "a test port"))
    try:
        silent = [socket.create_connection(("127.0.0.1", listener.port), timeout=10)
                  for _ in range(2)]
        assert wait_for(lambda: listener.handshaking == 2)
        with socket.create_connection(("127.0.0.1", listener.port), timeout=10) as third:
            assert third.recv(1) == b""  # closed at once
        # the refusal is recorded by the listener's thread, maybe after the close is seen
        assert wait_for(lambda: refused == [
            "2 connections are in their TLS handshake already (at most 2)"]), refused
        for s in silent:
            s.close()
        assert wait_for(lambda: listener.handshaking == 0)
    finally:
        loop.call(listener.close)


def test_a_slice_released_by_its_server_is_reported_released_by_the_sidecar(
        loop: LoopThread, authority: Authority) -> None:
    server = start_server(loop, authority)
    client, running = run_client(loop, server, authority.client())
    assert wait_for(client.ready)
    loop.run(server.release("the pod's decision was withdrawn"))
    assert running.result(30) == "the pod's decision was withdrawn"
    assert client.state == "released" and not client.ready()
    with pytest.raises(OSError):
        StubClient("127.0.0.1", client.port, timeout_s=2)  # the data plane is closed


def test_another_pods_certificate_is_refused_before_it_says_anything_and_not_held(
        loop: LoopThread, authority: Authority) -> None:
    """Any tenant holds a session certificate (its own pod's): the server must not wait for
    its hello nor keep its connection (each holds TLS buffers), or a few hundred idle ones
    would exhaust the server another tenant's slice runs in. Waiting for the hello would
    end in a timeout error instead of this refusal."""
    server = start_server(loop, authority)
    try:
        other = authority.client(uid=OTHER_UID, name="other")
        for _ in range(20):
            with tls_to(server, other) as sock:
                sock.settimeout(30)
                answer = answer_of(sock)  # said without any hello sent
                assert answer is not None and answer["ok"] is False
                assert answer["error"] == "refused", answer
                assert sock.recv(1) == b""  # then closed by the server
        assert server.status()["sessions"] == {"data": 0, "control": 0}
    finally:
        stop(loop, server)
