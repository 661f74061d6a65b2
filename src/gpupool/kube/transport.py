"""``LeanTransport``: stdlib ``http.client`` for the API calls on the bind path and the watches.

Every bind makes two writes (the GPULedger compare-and-swap, the Binding) and
every write comes back as watch events. Through lightkube and httpx2 a write
costs about 0.3 ms more than the same request on a kept-alive ``http.client``
connection, and a watch event about 0.1 ms more to read; ``KubeApi`` therefore
sends those calls here and everything else through lightkube. ``http.client``
opens the connections (TCP, TLS) and reads the watches; a request/answer exchange
is written and read by ``kube.http1`` (one buffer out, no ``email.parser`` on the
way in: half the client CPU of ``http.client``'s own exchange).

**When it is used** (``unsupported``): the connection facts come from
lightkube's loaded configuration (``SingleConfig``), not from a second reading
of the kubeconfig. The lean path is taken when the user authenticates with
nothing, a bearer token, a token file and/or a client certificate, and no proxy
from the environment applies to the server (lightkube's own httpx client is
asked). Otherwise — exec plugins, auth-provider, basic auth, a proxy —
``KubeApi`` keeps every call on lightkube, which implements them.

**What it keeps**

* TLS: the ``SSLContext`` lightkube itself builds (``verify_cluster``): the
  cluster's CA (file or data), ``insecure-skip-tls-verify``, the client
  certificate and key (file or data), ``SSL_CERT_FILE`` when the environment
  is trusted; host names are checked unless verification is off.
* Bearer token: static, or a token file (the in-cluster service account's,
  which the kubelet rotates) read again whenever the file changes (one
  ``stat`` per request) and once more after a 401.
* The timeout: connect and every read of a request; a watch reads with its
  server-side timeout plus a margin, so a dead connection ends it.

**Connections**: one kept-alive connection per thread (binds run concurrently
on a thread pool), one of its own per watch. A connection the server closed
while it was idle is replaced before it is used; a request that fails on a
reused connection before any answer arrives is sent once more on a new one.
``close`` shuts every socket down, which also ends a watch blocked on a read.

**Errors**: an answer of 300 or more raises the ``gpupool.kube.errors`` tree
(``from_status``) with the Status body's message after what was attempted;
a transport failure raises ``KubeError`` (code 0).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import select
import socket
import ssl
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit
from urllib.request import getproxies

import httpx2
import msgspec
from lightkube.config.client_adapter import verify_cluster
from lightkube.config.kubeconfig import SingleConfig
from lightkube.config.models import User

from gpupool.kube import http1
from gpupool.kube.errors import KubeError, from_status

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
USER_AGENT = "gpupool"
WATCH_MARGIN_S = 30.0  # a watch read waits its server timeout plus this before giving up
_RETRYABLE = (ConnectionError, ssl.SSLEOFError)  # the peer closed a kept-alive connection


class _Status(msgspec.Struct):
    message: str = ""
    reason: str = ""
    code: int = 0


def unsupported(config: SingleConfig) -> str:
    """Why the lean transport cannot serve ``config`` ('' when it can)."""
    scheme = urlsplit(config.cluster.server).scheme
    if scheme not in ("http", "https"):
        return f"server scheme {scheme!r}"
    user = config.user
    if user is None:
        return ""
    if user.token_file is None and user.token is None:
        for field, why in (("exec", "an exec credential plugin"),
                           ("auth_provider", "an auth-provider"),
                           ("username", "basic auth"), ("password", "basic auth")):
            if getattr(user, field) is not None:
                return why
    return ""


def proxied(http_client: Any, url: str) -> bool:
    """Whether lightkube's httpx client sends requests for ``url`` through a proxy (the
    environment's ``HTTPS_PROXY`` / ``NO_PROXY`` as httpx reads them). Asked of the client
    itself (a private method); if that cannot be asked, any proxy variable counts."""
    if not any(getproxies().get(k) for k in ("http", "https", "all")):
        return False
    try:
        transport = http_client._transport_for_url(httpx2.URL(url))
        return bool(transport is not http_client._transport)
    except Exception:  # an httpx without that method: be conservative
        return True


# -- bearer tokens --------------------------------------------------------------------------
class _NoToken:
    def header(self) -> str | None:
        return None

    def refresh(self) -> bool:
        return False


class _StaticToken(_NoToken):
    def __init__(self, token: str):
        self._header = f"Bearer {token.strip()}"

    def header(self) -> str | None:
        return self._header


class TokenFile(_NoToken):
    """A bearer token read from a file, read again when the file changes (or after a 401)."""

    def __init__(self, path: str):
        self.path = path
        self._cached: tuple[tuple[int, int, int], str] | None = None

    def _stamp(self) -> tuple[int, int, int]:
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise KubeError(f"token file {self.path}: {exc.strerror}") from None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _read(self, stamp: tuple[int, int, int]) -> str:
        try:
            with open(self.path, encoding="utf-8") as f:
                header = f"Bearer {f.read().strip()}"
        except (OSError, UnicodeDecodeError) as exc:
            raise KubeError(f"token file {self.path}: {exc}") from None
        self._cached = (stamp, header)
        return header

    def header(self) -> str | None:
        stamp = self._stamp()
        cached = self._cached
        return cached[1] if cached is not None and cached[0] == stamp else self._read(stamp)

    def refresh(self) -> bool:
        old = self._cached[1] if self._cached else None
        return self._read(self._stamp()) != old


# -- the transport ----------------------------------------------------------------------------
class LeanTransport:
    """Requests on kept-alive ``http.client`` connections (one per thread); thread-safe."""

    def __init__(self, server: str, context: ssl.SSLContext | None, token: _NoToken,
                 timeout_s: float):
        parts = urlsplit(server)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or "localhost"
        self.port = parts.port or (443 if self.https else 80)
        self.prefix = parts.path.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if self.port == (443 if self.https else 80) else \
            f"{host}:{self.port}"
        self.context = context
        self.token = token
        self.timeout_s = timeout_s
        self.sent = 0  # requests sent (for tests and benchmarks; not exact across threads)
        self._local = threading.local()
        self._open: set[http.client.HTTPConnection] = set()
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def for_config(cls, config: SingleConfig, timeout_s: float, trust_env: bool
                   ) -> LeanTransport:
        """From lightkube's loaded configuration (check ``unsupported`` first)."""
        user = config.user
        token: _NoToken = _NoToken()
        if user is not None and user.token_file is not None:  # lightkube's order
            token = TokenFile(user.token_file)  # as lightkube reads it (not made absolute)
        elif user is not None and user.token is not None:
            token = _StaticToken(user.token)
        context = None
        if urlsplit(config.cluster.server).scheme == "https":
            context = verify_cluster(config.cluster, user or User(), config.abs_file,
                                     trust_env=trust_env)
        return cls(config.cluster.server, context, token, timeout_s)

    # -- requests ----------------------------------------------------------------------------
    def request(self, method: str, path: str, what: str, body: bytes | None = None,
                content_type: str = JSON) -> bytes:
        """The answer's body; the errors tree for an answer of 300 or more."""
        status, data = self._exchange(method, path, what, body, content_type)
        if status == 401 and self._refreshed(what):
            status, data = self._exchange(method, path, what, body, content_type)
        if status >= 300:
            raise error_of(status, data, what)
        return data

    def _refreshed(self, what: str) -> bool:
        try:
            return self.token.refresh()
        except KubeError as exc:
            raise KubeError(f"{what}: {exc}") from None

    def _headers(self, what: str, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": JSON, "User-Agent": USER_AGENT}
        if content_type is not None:
            headers["Content-Type"] = content_type
        try:
            bearer = self.token.header()
        except KubeError as exc:
            raise KubeError(f"{what}: {exc}") from None
        if bearer is not None:
            headers["Authorization"] = bearer
        return headers

    def _exchange(self, method: str, path: str, what: str, body: bytes | None,
                  content_type: str) -> tuple[int, bytes]:
        headers = self._headers(what, content_type if body is not None else None)
        conn, reused = self._connection(what)
        try:
            return self._send(conn, method, path, body, headers)
        except _RETRYABLE as exc:
            self._discard(conn)
            if not reused or self._closed:
                raise self._failure(what, exc) from None
        except (OSError, http.client.HTTPException) as exc:
            self._discard(conn)
            raise self._failure(what, exc) from None
        conn, _ = self._connection(what)  # the kept-alive connection had been dropped
        try:
            return self._send(conn, method, path, body, headers)
        except (OSError, http.client.HTTPException) as exc:
            self._discard(conn)
            raise self._failure(what, exc) from None

    def _send(self, conn: http.client.HTTPConnection, method: str, path: str,
              body: bytes | None, headers: dict[str, str]) -> tuple[int, bytes]:
        """One exchange by ``http1`` on the connection's socket (opened, or re-opened
        after a ``Connection: close``, by ``http.client``)."""
        self.sent += 1
        if conn.sock is None:
            conn.connect()
        sock = conn.sock
        reader = getattr(self._local, "reader", None)
        if reader is None or reader.sock is not sock:
            reader = self._local.reader = http1.Reader(sock)
        sock.sendall(http1.request_bytes(method, self.host_header, self.prefix + path,
                                         headers, body))
        status, data, keep = http1.read_answer(reader, method)
        if not keep:
            _shut(conn)
        return status, data

    def _failure(self, what: str, exc: BaseException) -> KubeError:
        if self._closed:
            return KubeError(f"{what}: the client was closed")
        return KubeError(f"{what}: {type(exc).__name__}: {exc}")

    # -- connections -------------------------------------------------------------------------
    def _connection(self, what: str) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's connection and whether it was used before."""
        if self._closed:
            raise KubeError(f"{what}: the client was closed")
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None:
            if conn.sock is None:  # closed after a "Connection: close" answer: reopens
                return conn, False
            if not _dropped(conn.sock):
                return conn, True
            self._discard(conn)
        conn = self._new(self.timeout_s)
        self._local.conn = conn
        return conn, False

    def _new(self, timeout_s: float | None) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection
        if self.https:
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=timeout_s,
                                               context=self.context)
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout_s)
        with self._lock:
            self._open.add(conn)
        return conn

    def _discard(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._open.discard(conn)
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None
        _shut(conn)

    def close(self) -> None:
        """Shut every connection down (a thread reading one sees it end; each connection is
        closed by the thread that uses it, or with this object); calls after this raise
        ``KubeError``."""
        self._closed = True
        with self._lock:
            conns, self._open = list(self._open), set()
        for conn in conns:
            if conn.sock is not None:
                with contextlib.suppress(OSError):
                    conn.sock.shutdown(socket.SHUT_RDWR)

    # -- watches -----------------------------------------------------------------------------
    def stream(self, path: str, what: str, server_timeout_s: int | None) -> Iterator[bytes]:
        """The lines of a streamed answer (a watch), on a connection of its own; ends when
        the server ends the stream."""
        read_timeout = None if server_timeout_s is None else server_timeout_s + max(
            WATCH_MARGIN_S, self.timeout_s)
        conn = self._new(self.timeout_s)
        try:
            resp = self._open_stream(conn, path, what, read_timeout)
            if resp.status == 401 and self._refreshed(what):
                _shut(conn)
                resp = self._open_stream(conn, path, what, read_timeout)
            if resp.status >= 300:
                raise error_of(resp.status, resp.read(), what)
            yield from _lines(resp)
            if self._closed:
                raise KubeError(f"{what}: the client was closed")
        except (OSError, http.client.HTTPException) as exc:
            raise self._failure(what, exc) from None
        finally:
            self._discard(conn)

    def _open_stream(self, conn: http.client.HTTPConnection, path: str, what: str,
                     read_timeout: float | None) -> http.client.HTTPResponse:
        if self._closed:
            raise KubeError(f"{what}: the client was closed")
        conn.connect()
        if conn.sock is not None:
            conn.sock.settimeout(read_timeout)
        self.sent += 1
        conn.request("GET", self.prefix + path, headers=self._headers(what, None))
        return conn.getresponse()


def _lines(resp: http.client.HTTPResponse) -> Iterator[bytes]:
    rest = b""
    while True:
        data = resp.read1(65536)
        if not data:
            return
        if b"\n" not in data:
            rest += data
            continue
        lines = (rest + data).split(b"\n") if rest else data.split(b"\n")
        rest = lines.pop()
        for line in lines:
            if line.strip():
                yield line


def error_of(status: int, body: bytes, what: str) -> KubeError:
    """The exception for an answer of 300 or more, from its ``Status`` body if it has one."""
    try:
        st = msgspec.json.decode(body, type=_Status)
        message, reason = st.message, st.reason
    except (msgspec.DecodeError, msgspec.ValidationError):
        message, reason = "", ""
    if not message:
        text = body[:200].decode("utf-8", "replace").strip()
        message = f"HTTP {status}" + (f": {text}" if text else "")
    return from_status(status, reason, f"{what}: {message}")


def status_error(body: bytes, what: str) -> KubeError:
    """The exception for a ``Status`` object that came without an HTTP status (a watch's
    ERROR event); its ``code`` (500 when it has none)."""
    try:
        code = msgspec.json.decode(body, type=_Status).code
    except (msgspec.DecodeError, msgspec.ValidationError):
        code = 0
    return error_of(code if code >= 300 else 500, body, what)


def _dropped(sock: socket.socket) -> bool:
    """An idle kept-alive socket with something to read: the peer closed it (or broke the
    protocol); either way it cannot carry the next request."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def _shut(conn: http.client.HTTPConnection) -> None:
    """Close a connection of this thread's."""
    with contextlib.suppress(OSError):
        conn.close()
