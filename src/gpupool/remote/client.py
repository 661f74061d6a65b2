"""The client sidecar: the workload's end of a remote slice, inside its pod.

``SliceClient`` keeps one **control channel** to its slice server (``channel``):
mutual TLS with the pod's session certificate, the server checked to be the slice
server of this very pod (``spiffe://gpupool.io/slice-server/<uid>``), then heartbeats
both ways. Its state, which ``status()`` reports and the readiness probe reads:

* ``waiting`` — the server has not answered yet (it may still be starting); the
  sidecar tries again, soon at first, then every ``retry_s``; after ``wait_s`` without
  one answer it gives up (``run`` raises ``ServerUnreachable``: the pod's log says why);
* ``ready`` — the control channel is up and the server's heartbeats arrive; the
  data plane is open on loopback (``listen``);
* ``lost`` — the server was ready and then stopped answering for ``deadline_s`` (or
  the channel broke); new local connections are refused, and the sidecar reconnects
  as soon as the server answers again (to a server placed again, the state on the GPU
  is gone);
* ``refused`` — the server refused this pod's credentials (the reason is kept: an
  expired or revoked certificate, another pod's); it tries again, so a rotated
  certificate is picked up;
* ``released`` — the server released the slice (its reason is kept); final.

The **data plane** is a listener on loopback (``listen_host``, by default
``127.0.0.1``): every local connection is carried over its own TLS data channel to the
server and from there to the provider, unchanged.

The sidecar of a ``remote-allowed`` pod is told its pod's decision (``served_remotely``):
when the pod's own devices serve it, ``LocalSlice`` stands in for ``SliceClient`` — state
``local``, ready at once, no data plane, no credentials read — and idles until the pod
stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpupool.contract import annotations as records
from gpupool.contract import names
from gpupool.core.errors import GpupoolError, InvalidInput
from gpupool.remote import channel, frames
from gpupool.remote.channel import Liveness, Released, Timing
from gpupool.remote.credentials import CredentialPaths, Credentials
from gpupool.remote.frames import FrameError
from gpupool.remote.listening import listen, tls_reason
from gpupool.remote.relay import relay
from gpupool.security import sessions

log = logging.getLogger(__name__)

FIRST_RETRY_S = 0.05
"""The first pause before trying the server again; it doubles up to ``retry_s``."""


class ServerUnreachable(GpupoolError):
    """The slice server never answered within the wait; the message says what was tried."""


class Refused(Exception):
    """The server (or its identity) was refused, or it refused us; the message says why."""


def served_remotely(decision: str, pod_uid: str) -> bool:
    """Whether the pod's decision (its ``gpupool.io/allocation``; "" when it has none: only
    gpupool's extender places a slice elsewhere, and its bind writes the decision with the
    binding) is served by a slice server. ``InvalidInput`` when it cannot be read."""
    if not decision.strip():
        return False
    try:
        found = records.decode(pod_uid, {names.ANNOTATION_ALLOCATION: decision})
    except InvalidInput as exc:
        raise InvalidInput(f"--decision: {exc}") from None
    return bool(found.allocation.served_by)


class LocalSlice:
    """The sidecar of a ``remote-allowed`` pod served by its own node's devices: ready at
    once, nothing to serve; ``run`` idles until it is cancelled (the pod stops)."""

    state = "local"
    reason = ("the pod's GPUs are its own node's devices (its decision is not served by a "
              "slice server): nothing to serve")

    async def run(self) -> str:
        await asyncio.Event().wait()
        return self.reason  # never reached: cancelled when the pod stops

    def ready(self) -> bool:
        return True

    def status(self) -> dict[str, Any]:
        return {"state": self.state, "reason": self.reason}

    async def close(self) -> None:
        return None


@dataclass(frozen=True, slots=True)
class ClientConfig:
    pod_uid: str
    server_host: str
    server_port: int
    credentials: CredentialPaths
    listen_host: str = "127.0.0.1"
    listen_port: int = 14833
    timing: Timing = field(default_factory=Timing)
    wait_s: float = 300.0
    retry_s: float = 1.0
    connect_s: float = 10.0
    credentials_later: bool = False  # a remote-allowed pod's: its Secret may come after start


class SliceClient:
    """The sidecar of one pod's remote slice."""

    def __init__(self, config: ClientConfig, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        self.config = config
        self.clock = clock
        self.wall = wall
        self.identity = sessions.server_uri(config.pod_uid)
        self.credentials = None if config.credentials_later else \
            Credentials(config.credentials, server=False, wall=wall)
        self.state = "waiting"
        self.reason = "the slice server has not answered yet"
        self.port = config.listen_port
        self.slice: dict[str, Any] = {}
        self.liveness: Liveness | None = None
        self.relays = 0
        self._listener: asyncio.Server | None = None
        self._since = clock()

    # -- the control channel ------------------------------------------------------------------
    async def run(self) -> str:
        """Keep the control channel up until the server releases the slice (returns why);
        ``ServerUnreachable`` when it never answered within ``wait_s``."""
        started, pause = self.clock(), FIRST_RETRY_S
        try:
            while True:
                try:
                    reader, writer = await self.open("control")
                except (Refused, OSError, TimeoutError, FrameError, InvalidInput) as exc:
                    self._failed(exc, started)
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, self.config.retry_s)
                    continue
                pause = FIRST_RETRY_S
                try:
                    await self._ready()
                    why = await channel.heartbeats(reader, writer, self.config.timing,
                                                   self._heard, self.clock)
                except Released as exc:
                    self._set("released", str(exc))
                    return str(exc)
                finally:
                    await frames.close(writer)
                self._set("lost", f"the slice server is lost: {why}")
        finally:
            if self._listener is not None:
                self._listener.close()

    def _failed(self, exc: BaseException, started: float) -> None:
        what = str(exc) if isinstance(exc, Refused | InvalidInput) else \
            f"{type(exc).__name__}: {exc}"
        if isinstance(exc, Refused):
            self._set("refused", what)
        elif self.state == "waiting":
            self.reason = f"the slice server has not answered yet ({what})"
            if self.clock() - started > self.config.wait_s:
                raise ServerUnreachable(
                    f"slice server {self.config.server_host}:{self.config.server_port} did not "
                    f"answer within {self.config.wait_s:g} s: {what}")
        else:
            self._set("lost", f"the slice server is lost: {what}")

    async def _ready(self) -> None:
        self.liveness = Liveness(self.config.timing.deadline_s, self.clock())
        if self._listener is None:
            self._listener = await listen(self._local, self.config.listen_host,
                                          self.config.listen_port, "the data plane")
            self.port = self._listener.sockets[0].getsockname()[1]
            log.info("data plane on %s:%d", self.config.listen_host, self.port)
        self._set("ready", f"serving the slice of GPU {self.slice.get('gpu_uuid')}")

    def _heard(self) -> None:
        if self.liveness is not None:
            self.liveness.heard(self.clock())

    def _set(self, state: str, reason: str) -> None:
        if state != self.state:
            (log.info if state == "ready" else log.warning)("slice %s: %s", state, reason)
            self._since = self.clock()
        self.state, self.reason = state, reason

    async def open(self, kind: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A TLS channel of ``kind`` to the server, greeted; ``Refused`` with the reason."""
        c = self.config
        credentials = self._credentials()
        own = credentials.own_refusal()
        if own:
            raise Refused(own)
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(
                c.server_host, c.server_port, ssl=credentials.context,
                server_hostname=c.server_host, ssl_handshake_timeout=c.connect_s), c.connect_s)
        except ssl.SSLError as exc:
            raise Refused(f"TLS with the server at {c.server_host}:{c.server_port} failed "
                          f"({tls_reason(exc)})") from None
        try:
            why = credentials.admit(writer.get_extra_info("ssl_object"), self.identity)
            if why:
                raise Refused(f"the server at {c.server_host}:{c.server_port} is not this "
                              f"pod's slice server: {why}")
            await frames.send(writer, channel.hello(kind))
            answer = await frames.read(reader, channel.HELLO)
            if answer is None:
                raise Refused("the server closed the connection without answering (see its "
                              "/status for why it refused)")
            if not answer.header.get("ok"):
                raise Refused(f"the server refused: {answer.header.get('message')}")
            self.slice = dict(answer.header.get("slice") or {})
            return reader, writer
        except ssl.SSLError as exc:
            await frames.close(writer)
            raise Refused(f"the server refused this pod's certificate during TLS "
                          f"({tls_reason(exc)})") from None
        except BaseException:
            await frames.close(writer)
            raise

    def _credentials(self) -> Credentials:
        """The session credentials, read again if they changed; read for the first time
        here when they may come after start (``InvalidInput`` while they are not there: the
        controller issues them once the slice is placed)."""
        if self.credentials is None:
            try:
                self.credentials = Credentials(self.config.credentials, server=False,
                                               wall=self.wall)
            except InvalidInput as exc:
                raise InvalidInput(f"the slice's session credentials are not there yet "
                                   f"({exc})") from None
        else:
            self.credentials.refresh()
        return self.credentials

    # -- the data plane ---------------------------------------------------------------------
    async def _local(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.state != "ready":
            log.info("local connection refused: the slice is %s (%s)", self.state, self.reason)
            await frames.close(writer)
            return
        try:
            remote = await self.open("data")
        except (Refused, OSError, TimeoutError, FrameError) as exc:
            log.warning("data channel to the server failed: %s", exc)
            await frames.close(writer)
            return
        self.relays += 1
        try:
            await relay((reader, writer), remote)
        finally:
            self.relays -= 1

    # -- reports ----------------------------------------------------------------------------
    def ready(self) -> bool:
        return self.state == "ready"

    def status(self) -> dict[str, Any]:
        now = self.clock()
        return {"state": self.state, "reason": self.reason,
                "since_s": round(now - self._since, 3),
                "server": f"{self.config.server_host}:{self.config.server_port}",
                "data_plane": f"{self.config.listen_host}:{self.port}",
                "server_heard_s_ago": None if self.liveness is None else
                round(self.liveness.age(now), 3),
                "relays": self.relays, "slice": self.slice}

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
            with contextlib.suppress(Exception):
                await self._listener.wait_closed()
