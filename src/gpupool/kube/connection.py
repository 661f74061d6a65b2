"""``ApiTransport``: the HTTP transport under lightkube's client, httpx's own with what a
long-running controller needs and lightkube leaves out.

lightkube reads the kubeconfig and sets up everything about *who* talks to the API
server: the server URL, TLS (``verify_cluster``: the cluster's CA as a file or data,
``insecure-skip-tls-verify``, the client certificate and key), the credentials (a
static token, a token file read again after a 401 — the in-cluster service account's,
which the kubelet rotates —, an exec plugin, basic auth) and the error answers.
``KubeApi`` hands lightkube this transport, which is httpx's ``HTTPTransport`` built
with the TLS context lightkube's own ``verify_cluster`` makes, plus:

* **TCP keep-alive** on every connection (first probe after ``KEEPALIVE_IDLE_S`` of
  silence, then every ``KEEPALIVE_INTERVAL_S``; ``KEEPALIVE_PROBES`` unanswered probes
  end the connection): a kept-alive or watching connection to a machine that vanished
  (rebooted, cut off, a NAT entry dropped) fails within about a minute instead of
  waiting for ever.
* **A bound on each read of a watch.** lightkube reads watches with no read timeout.
  Every watch gpupool makes asks the server to end it after ``timeoutSeconds`` (the
  API server does, to the second); a read that waits ``timeoutSeconds`` plus the
  margin (``WATCH_MARGIN_S``, at least the request timeout) without a byte means the
  server, or a proxy or load balancer between, stopped answering while the TCP
  connection stays up. The watch then fails with ``httpx2.ReadTimeout`` (``KubeApi``:
  ``KubeError``; the informer lists again). A watch without ``timeoutSeconds`` keeps
  lightkube's unbounded read (keep-alive still ends it if the peer vanishes).
* **close ends what is being read, and frees no socket under a reader**: ``close`` shuts
  down the sockets of answers still being read, so a watch waiting on a quiet stream
  ends at once (closing a socket that another thread is reading does not wake that
  thread on Linux). It closes the connections only once no thread is inside a request
  or a read: ``recv`` looks the socket's descriptor up, then waits on that number, so a
  descriptor freed in between could be taken by the next connection opened, and the
  reader would wait on, and read, that other connection. ``close`` returns at once;
  the last thread to come out of a read closes the connections, and no read or request
  starts after ``close``.
* **The environment's proxy**: httpx applies ``HTTPS_PROXY`` / ``HTTP_PROXY`` /
  ``ALL_PROXY`` and ``NO_PROXY`` only to transports it makes itself, so with
  ``trust_env`` this one is built for the proxy the environment names for the API
  server (``proxy_for``), unless ``NO_PROXY`` exempts the server.

Connections are httpx's pool (kept alive, at most 100, 20 kept idle for 5 s), shared
by the threads of one ``KubeApi``.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

import httpx2
from lightkube.config.client_adapter import verify_cluster
from lightkube.config.kubeconfig import SingleConfig
from lightkube.config.models import User

WATCH_MARGIN_S = 30.0  # a watch read waits timeoutSeconds plus this before giving up
KEEPALIVE_IDLE_S = 30
KEEPALIVE_INTERVAL_S = 10
KEEPALIVE_PROBES = 3


def keepalive_options() -> list[tuple[int, int, int]]:
    """``setsockopt`` arguments that turn TCP keep-alive on with gpupool's timing (the
    timing options the platform has: Linux all three, macOS idle only)."""
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_S),
                        ("TCP_KEEPALIVE", KEEPALIVE_IDLE_S),  # macOS's name for the idle time
                        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
                        ("TCP_KEEPCNT", KEEPALIVE_PROBES)):
        option = getattr(socket, name, None)
        if option is not None and not (name == "TCP_KEEPALIVE" and
                                       hasattr(socket, "TCP_KEEPIDLE")):
            options.append((socket.IPPROTO_TCP, option, value))
    return options


def proxy_for(server: str) -> str | None:
    """The proxy the environment names for ``server`` (``HTTPS_PROXY`` for an https://
    server, ``HTTP_PROXY`` for http://, else ``ALL_PROXY``; none when ``NO_PROXY``
    lists the server's host, a domain it is in, or ``*``)."""
    parts = urlsplit(server)
    proxies = getproxies()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy or proxy_bypass(parts.netloc):
        return None
    return proxy if "://" in proxy else f"http://{proxy}"


def tls_context(config: SingleConfig, trust_env: bool) -> ssl.SSLContext:
    """The TLS context lightkube builds for the cluster (``verify_cluster``: the cluster's
    CA, ``insecure-skip-tls-verify``, the client certificate). An ``http://`` server speaks
    no TLS: its context trusts no certificate at all, and is made without reading a CA
    bundle (which costs tens of milliseconds)."""
    if urlsplit(config.cluster.server).scheme != "https":
        return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    return verify_cluster(config.cluster, config.user or User(), config.abs_file,
                          trust_env=trust_env)


class ApiTransport(httpx2.BaseTransport):
    """httpx's transport to one API server, with keep-alive, bounded watch reads and a
    ``close`` that ends answers being read (module docstring). Thread-safe."""

    def __init__(self, context: ssl.SSLContext, proxy: str | None = None,
                 watch_margin_s: float = WATCH_MARGIN_S):
        self._inner = httpx2.HTTPTransport(verify=context, proxy=proxy,
                                           socket_options=keepalive_options())
        self.watch_margin_s = watch_margin_s
        self.closed = False
        self._reading: set[socket.socket] = set()  # the sockets of answers being read
        self._inside = 0  # threads inside a request or a read of an answer
        self._pool_open = True
        self._lock = threading.Lock()

    @classmethod
    def for_config(cls, config: SingleConfig, timeout_s: float, trust_env: bool,
                   watch_margin_s: float = WATCH_MARGIN_S,
                   context: ssl.SSLContext | None = None) -> ApiTransport:
        """For lightkube's loaded configuration: its TLS context (``tls_context``, unless
        one made before is given), the environment's proxy when ``trust_env``; watch reads
        bounded by at least ``timeout_s`` more than the server was asked to take."""
        proxy = proxy_for(config.cluster.server) if trust_env else None
        return cls(context or tls_context(config, trust_env), proxy,
                   max(watch_margin_s, timeout_s))

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        silence = self._bound_watch_read(request)
        self._enter(httpx2.ConnectError)
        try:
            response = self._send(request, silence)
            sock = _socket_of(response)
            if sock is not None:
                with self._lock:
                    self._reading.add(sock)
                    if self.closed:  # closed while this answer's head was on its way
                        _shut_down(sock)
        finally:
            self._leave()
        assert isinstance(response.stream, httpx2.SyncByteStream)
        response.stream = _Reading(response.stream, self, sock, silence)
        return response

    def _send(self, request: httpx2.Request, silence: tuple[int, float] | None
              ) -> httpx2.Response:
        try:
            return self._inner.handle_request(request)
        except httpx2.ReadTimeout as exc:
            raise _silent(exc, silence) from None
        except httpx2.TransportError:
            if self.closed:  # closed while this request or its answer's head was on its way
                raise httpx2.ReadError("the client was closed") from None
            raise

    def _bound_watch_read(self, request: httpx2.Request) -> tuple[int, float] | None:
        """For a watch with ``timeoutSeconds`` and no read timeout: (the seconds the
        server was asked to take, the read timeout set)."""
        if b"watch=" not in request.url.query:  # most requests: not a watch (no parsing)
            return None
        params = request.url.params
        seconds = params.get("timeoutSeconds")
        if params.get("watch") not in ("true", "1") or not seconds or not seconds.isdigit():
            return None
        timeout = dict(request.extensions.get("timeout") or {})
        if timeout.get("read") is not None:
            return None
        timeout["read"] = int(seconds) + self.watch_margin_s
        request.extensions["timeout"] = timeout
        return int(seconds), timeout["read"]

    def next_chunk(self, chunks: Iterator[bytes], silence: tuple[int, float] | None
                   ) -> bytes | None:
        """The next piece of an answer's body (``None`` at its end), read as a thread inside
        (``close`` frees no socket meanwhile); none is read once the client is closed."""
        self._enter(httpx2.ReadError)
        try:
            return next(chunks, None)
        except httpx2.TransportError as exc:
            if self.closed:
                raise httpx2.ReadError("the client was closed") from None
            if isinstance(exc, httpx2.ReadTimeout):
                raise _silent(exc, silence) from None
            raise
        finally:
            self._leave()

    def done_reading(self, sock: socket.socket | None) -> None:
        """An answer's reader let go of ``sock``: ``close`` no longer shuts it down (its
        connection may go back to the pool, or be closed, next)."""
        if sock is not None:
            with self._lock:
                self._reading.discard(sock)

    def close(self) -> None:
        """Shut down the sockets of answers being read (their readers see the end), then
        close every connection, at once or as soon as the last thread inside a request or a
        read comes out; requests and reads after this fail."""
        with self._lock:
            self.closed = True
            for sock in self._reading:  # under the lock: no reader frees one meanwhile
                _shut_down(sock)
        self._close_pool_when_unused()

    def _enter(self, refusal: type[httpx2.TransportError]) -> None:
        """Count the calling thread as inside a request or a read until ``_leave`` (the
        connections stay open meanwhile); ``refusal`` once the client is closed. (A pair of
        calls, not a context manager: this runs for every request and every piece read.)"""
        with self._lock:
            if self.closed:
                raise refusal("the client was closed")
            self._inside += 1

    def _leave(self) -> None:
        """The calling thread came out of a request or a read: the last one out of a closed
        client closes the connections."""
        with self._lock:
            self._inside -= 1
            unused = self.closed and self._inside == 0 and self._pool_open
            if unused:
                self._pool_open = False
        if unused:
            self._inner.close()

    def _close_pool_when_unused(self) -> None:
        """Close every connection once the client is closed and no thread is inside (once)."""
        with self._lock:
            unused = self.closed and self._inside == 0 and self._pool_open
            if unused:
                self._pool_open = False
        if unused:
            self._inner.close()


class _Reading(httpx2.SyncByteStream):
    """An answer's body while it is read: each read goes through ``ApiTransport.next_chunk``
    and its socket is known to ``ApiTransport.close`` until the reader lets go (the end of
    the body, an error, the body's close or its iterator dropped)."""

    def __init__(self, inner: httpx2.SyncByteStream, owner: ApiTransport,
                 sock: socket.socket | None, silence: tuple[int, float] | None):
        self._inner = inner
        self._owner = owner
        self._sock = sock
        self._silence = silence
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        chunks = iter(self._inner)
        try:
            while (chunk := self._owner.next_chunk(chunks, self._silence)) is not None:
                yield chunk
        finally:
            self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._owner.done_reading(self._sock)  # before the connection may be closed
        self._inner.close()


def _silent(exc: httpx2.ReadTimeout, silence: tuple[int, float] | None
            ) -> httpx2.ReadTimeout:
    """The timeout of a bounded watch read, saying what was waited for."""
    if silence is None:
        return exc
    asked, waited = silence
    return httpx2.ReadTimeout(f"nothing arrived for {waited:g} s on a watch the server was "
                              f"asked to end after {asked} s: the server stopped answering")


def _socket_of(response: httpx2.Response) -> socket.socket | None:
    """The socket an answer is read from (``None`` through a TLS proxy tunnel)."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    return sock if isinstance(sock, socket.socket) else None


def _shut_down(sock: socket.socket) -> None:
    """End the connection under a reader (``socket.socket``'s own shutdown, also for TLS
    sockets: ``SSLSocket.shutdown`` would take the TLS object from under that reader)."""
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
