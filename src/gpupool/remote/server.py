"""The slice server: one per remote slice, on the GPU node, in front of the provider.

``SliceServer`` starts the provider (``provider``: pinned to the decided GPU, limited
by the node's isolation provider, on loopback), then listens for the sidecar of the one
pod its slice was decided for, behind mutual TLS:

1. **accept**: TLS with a certificate of gpupool's CA required; then the peer must be
   that pod's sidecar (``spiffe://gpupool.io/pod/<uid>``), a client certificate, valid
   now, not in the revocation list (``credentials``). Anything else is refused, with
   the reason answered when TLS allows and kept in ``status()["refusals"]``;
2. **hello**: ``data`` channels are relayed to the provider's loopback port unchanged;
   ``control`` channels exchange heartbeats (``channel``);
3. **release**: when no sidecar has been heard from for the heartbeat deadline (or none
   ever connected within ``connect_deadline_s``), or when asked (``release``), the
   server tells the sidecars, closes every channel, stops the provider — which frees
   every byte the slice held — and reports ``released`` with its reason. ``wait``
   returns the reason; nothing of the slice is held after that.

Usage (``usage``): sampled from the provider every heartbeat interval, reported per
session in the node agent's over-use shape (``usage_records``). The revocation list is
also checked against open sessions at every interval: a session whose certificate is
revoked or has expired since it connected is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpupool.remote import channel, frames
from gpupool.remote.channel import Liveness, Timing
from gpupool.remote.credentials import CredentialPaths, Credentials
from gpupool.remote.frames import FrameError
from gpupool.remote.listening import ListenError, TlsListener, tls_reason
from gpupool.remote.provider import LOOPBACK, ProviderProcess, SliceSpec
from gpupool.remote.relay import relay
from gpupool.remote.usage import UsageMeter, stub_sample
from gpupool.security import sessions

log = logging.getLogger(__name__)
REFUSED_CLOSE_S = 0.5
"""How long a refused peer (another pod's certificate) has to close after its refusal."""

REFUSALS_KEPT = 20


@dataclass(frozen=True, slots=True)
class ServerConfig:
    slice: SliceSpec
    host: str
    port: int
    credentials: CredentialPaths
    timing: Timing = field(default_factory=Timing)
    connect_deadline_s: float = 300.0
    handshake_s: float = 10.0
    stub_usage: bool = False  # the provider is the stub: sample its usage operation


@dataclass(eq=False)
class _Session:
    """One open channel of the sidecar."""

    kind: str
    writer: asyncio.StreamWriter
    serial: int
    not_after: float
    peer: str


class SliceServer:
    """Serves one remote slice until it is released."""

    def __init__(self, config: ServerConfig, provider: ProviderProcess,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        self.config = config
        self.provider = provider
        self.clock = clock
        self.wall = wall
        self.identity = sessions.client_uri(config.slice.pod_uid)
        self.credentials = Credentials(config.credentials, server=True, wall=wall)
        self.meter = UsageMeter(config.slice)
        self.state = "starting"
        self.reason = ""
        self.port = config.port
        self.liveness: Liveness | None = None  # None until a sidecar first connects
        self.sessions: set[_Session] = set()
        self.refusals: deque[dict[str, Any]] = deque(maxlen=REFUSALS_KEPT)
        self.refused_total = 0
        self._started_at = clock()
        self._listener: TlsListener | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._done = asyncio.Event()

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        """Start the provider, then listen; ``ProviderError`` when the provider cannot."""
        await self.provider.start()
        self._listener = TlsListener(self._context, self._serve, self._refused_tls,
                                     self.config.handshake_s)
        try:
            await self._listener.start(self.config.host, self.config.port,
                                       "the slice's TLS port")
        except ListenError:
            await self.provider.stop()
            raise
        self.port = self._listener.port
        self._started_at = self.clock()
        self.state = "serving"
        self._spawn(self._watch())
        log.info("slice server for pod %s (%s) on %s:%d: GPU %s, %d MiB, %d %% compute",
                 self.config.slice.pod_ref, self.config.slice.pod_uid, self.config.host,
                 self.port, self.config.slice.gpu_uuid, self.config.slice.memory_mib,
                 self.config.slice.core_pct)

    async def wait(self) -> str:
        """Wait until the slice is released; why it was."""
        await self._done.wait()
        return self.reason

    async def release(self, reason: str) -> None:
        """Release the slice: tell the sidecars, close everything, stop the provider."""
        if self.state in ("releasing", "released"):
            return
        self.state, self.reason = "releasing", reason
        log.warning("releasing the slice of pod %s: %s", self.config.slice.pod_ref, reason)
        if self._listener is not None:
            self._listener.close()
        for session in list(self.sessions):
            if session.kind == "control":
                with contextlib.suppress(ConnectionError, OSError, RuntimeError):
                    session.writer.write(frames.encode({"op": "released", "reason": reason}))
            await frames.close(session.writer)
        self.sessions.clear()
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        await self.provider.stop()
        self.meter.released()
        self.state = "released"
        self._done.set()
        log.info("released the slice of pod %s: provider stopped, nothing held",
                 self.config.slice.pod_ref)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- the watchdog: deadlines, revocations, usage ------------------------------------
    async def _watch(self) -> None:
        interval = self.config.timing.interval_s
        while self.state == "serving":
            await asyncio.sleep(interval)
            why = self.deadline_passed(self.clock())
            if why:
                await self.release(why)
                return
            try:
                self._close_invalid_sessions()
                await self._sample()
            except Exception:  # a bug: said, and the watch (deadlines, revocations) goes on
                log.exception("slice server watch round failed")

    def deadline_passed(self, now: float) -> str:
        """Why the slice is to be released now for lack of a client ("" if not)."""
        if self.liveness is None:
            waited = now - self._started_at
            if waited > self.config.connect_deadline_s:
                return f"no client connected within {self.config.connect_deadline_s:g} s"
            return ""
        if self.liveness.past(now):
            return (f"no heartbeat from the client for {self.liveness.age(now):.0f} s "
                    f"(deadline {self.liveness.deadline_s:g} s)")
        return ""

    def _close_invalid_sessions(self) -> None:
        self.credentials.refresh()
        now = self.wall()
        for session in list(self.sessions):
            why = ("revoked" if session.serial in self.credentials.revoked else
                   "expired" if now >= session.not_after else "")
            if why:
                log.warning("closing a %s channel of %s: its certificate is %s", session.kind,
                            session.peer, why)
                self.sessions.discard(session)
                session.writer.close()

    async def _sample(self) -> None:
        if not self.config.stub_usage:
            return
        try:
            self.meter.add(await stub_sample(self.provider.spec.port, time.monotonic_ns()))
        except (OSError, TimeoutError, FrameError) as exc:
            log.warning("usage sample of the provider failed: %s", exc)

    # -- connections ----------------------------------------------------------------------
    def _context(self) -> ssl.SSLContext:
        self.credentials.refresh()
        return self.credentials.context

    def _refused_tls(self, peer: str, exc: BaseException) -> None:
        self._refuse(peer, f"TLS handshake failed: {tls_reason(exc)}")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     peer: str) -> None:
        try:
            await self._greet(reader, writer, peer)
        except (ConnectionError, OSError) as exc:
            log.debug("connection from %s ended: %s", peer, exc)
        except Exception:  # a bug: drop this connection, keep serving
            log.exception("connection from %s failed", peer)
        finally:
            await frames.close(writer)

    async def _greet(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     peer: str) -> None:
        ssl_object = writer.get_extra_info("ssl_object")
        why = self.credentials.admit(ssl_object, self.identity)
        if why:  # not this slice's client: refused at once, nothing read or held for it
            self._refuse(peer, why)
            await _say(writer, frames.error("refused", why))
            writer.close()  # the refusal is flushed first; a peer that never says goodbye
            with contextlib.suppress(OSError, TimeoutError):  # is cut off: nothing held
                await asyncio.wait_for(writer.wait_closed(), REFUSED_CLOSE_S)
            writer.transport.abort()
            return
        try:
            hello = await frames.read(reader, channel.HELLO)
            if hello is None:
                return
            kind = channel.channel_of(hello.header)
        except FrameError as exc:
            self._refuse(peer, str(exc))
            await _say(writer, frames.error(exc.code, str(exc)))
            return
        if why or self.state != "serving":
            why = why or f"the slice is {self.state}"
            self._refuse(peer, why)
            await _say(writer, frames.error("refused", why))
            return
        await self._open(kind, reader, writer, peer, ssl_object)

    async def _open(self, kind: str, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter, peer: str, ssl_object: Any) -> None:
        cred = sessions.read_credential(ssl_object.getpeercert(binary_form=True))
        session = _Session(kind, writer, cred.serial, cred.not_after, peer)
        self._heard()
        await frames.send(writer, {"ok": True, "slice": self._described()})
        self.sessions.add(session)
        try:
            if kind == "control":
                why = await channel.heartbeats(reader, writer, self.config.timing, self._heard,
                                               self.clock)
                log.info("control channel from %s ended: %s", peer, why)
            else:
                provider = await asyncio.open_connection(LOOPBACK, self.provider.spec.port)
                await relay((reader, writer), provider)
        finally:
            self.sessions.discard(session)

    def _heard(self) -> None:
        now = self.clock()
        if self.liveness is None:
            self.liveness = Liveness(self.config.timing.deadline_s, now)
        self.liveness.heard(now)

    def _refuse(self, peer: str, why: str) -> None:
        self.refused_total += 1
        self.refusals.append({"peer": peer, "reason": why, "at": round(self.wall(), 3)})
        log.warning("refused %s: %s", peer, why)

    # -- reports ----------------------------------------------------------------------------
    def _described(self) -> dict[str, Any]:
        s = self.config.slice
        return {"pod_uid": s.pod_uid, "gpu_uuid": s.gpu_uuid, "memory_mib": s.memory_mib,
                "core_pct": s.core_pct}

    def usage_records(self) -> list[dict[str, Any]]:
        """Per-session usage, in the node agent's ``Observation`` fields (``usage``)."""
        return [dict(self.meter.record)] if self.config.stub_usage else []

    def status(self) -> dict[str, Any]:
        now = self.clock()
        return {"state": self.state, "reason": self.reason, "slice": self._described(),
                "pod_ref": self.config.slice.pod_ref, "port": self.port,
                "provider_pid": self.provider.pid,
                "sessions": {k: sum(1 for s in self.sessions if s.kind == k)
                             for k in channel.CHANNELS},
                "client_heard_s_ago": None if self.liveness is None else
                round(self.liveness.age(now), 3),
                "refused_total": self.refused_total, "refusals": list(self.refusals),
                "usage": self.usage_records()}


async def _say(writer: asyncio.StreamWriter, header: dict[str, Any]) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        await frames.send(writer, header)
