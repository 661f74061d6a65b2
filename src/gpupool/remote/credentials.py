"""A terminator's credentials, read from files and read again when they change.

The slice server and the client sidecar each get a certificate, its key and gpupool's
CA as files (a Secret mounted into the pod), and the server also the revocation list
(a ConfigMap). The control side rotates them by rewriting those files; each new
connection first checks whether a file changed (``stat``: inode, size, modification
time — a mounted Secret or ConfigMap is swapped by a symlink, which changes all three)
and, if so, builds its TLS context again. Material that does not load (a file caught
half-written, a list not signed by the CA) is logged and the previous material kept;
at start it is an error.

Identities (``gpupool.security.sessions``) are checked after the handshake: OpenSSL
checks the chain to the CA and the validity period; ``admit`` the pod named, the usage
and the revocation list.
"""

from __future__ import annotations

import logging
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpupool.core.errors import InvalidInput
from gpupool.security import sessions
from gpupool.security.certs import CertificateError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CredentialPaths:
    cert: Path
    key: Path
    ca: Path
    revocations: Path | None = None


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class Credentials:
    """The current TLS context and revocation list of one terminator (one event loop)."""

    def __init__(self, paths: CredentialPaths, server: bool,
                 wall: Callable[[], float] = time.time):
        self.paths = paths
        self.server = server
        self.wall = wall
        self.revoked: frozenset[int] = frozenset()
        self.own: sessions.Credential | None = None
        self._stamps: dict[tuple[str, Path], tuple[int, int, int] | None] = {}
        self._context: ssl.SSLContext | None = None
        self.refresh(strict=True)

    @property
    def context(self) -> ssl.SSLContext:
        assert self._context is not None
        return self._context

    def refresh(self, strict: bool = False) -> None:
        """Load what changed since the last call (``strict``: raise instead of keeping)."""
        p = self.paths
        if self._changed("tls", p.cert, p.key, p.ca):
            try:
                self._context = self._make_context()
            except (OSError, ssl.SSLError, ValueError) as exc:
                self._fail(f"cannot load the certificate {p.cert}, key {p.key} and CA {p.ca}: "
                           f"{exc}", strict)
        if p.revocations is not None and self._changed("revocations", p.revocations, p.ca):
            try:
                self.revoked = sessions.revoked_serials(p.revocations.read_text(),
                                                        p.ca.read_text())
            except (OSError, CertificateError) as exc:
                self._fail(f"cannot read the revocation list {p.revocations}: {exc}", strict)
            else:
                log.info("revocation list %s: %d revoked", p.revocations, len(self.revoked))

    def _changed(self, use: str, *paths: Path) -> bool:
        """Whether any of ``paths`` changed since ``use`` last loaded them."""
        stamps = {(use, path): _stamp(path) for path in paths}
        changed = any(self._stamps.get(key, "unseen") != stamp for key, stamp in stamps.items())
        self._stamps.update(stamps)
        return changed

    def _fail(self, message: str, strict: bool) -> None:
        if strict:
            raise InvalidInput(message)
        log.warning("%s; keeping what was loaded before", message)

    def own_refusal(self) -> str | None:
        """Why this process's own certificate is not valid now (None: it is)."""
        if self.own is None:
            return None
        now = self.wall()
        if now >= self.own.not_after:
            return f"this process's certificate expired at {sessions.iso(self.own.not_after)}"
        if now < self.own.not_before:
            return (f"this process's certificate is not valid before "
                    f"{sessions.iso(self.own.not_before)}")
        return None

    def _make_context(self) -> ssl.SSLContext:
        p = self.paths
        self.own = sessions.read_credential(ssl.PEM_cert_to_DER_cert(p.cert.read_text()))
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if self.server else ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.check_hostname = False  # the peer is checked by its gpupool identity (``admit``)
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cafile=str(p.ca))
        ctx.load_cert_chain(str(p.cert), str(p.key))
        return ctx

    def admit(self, ssl_object: ssl.SSLObject | ssl.SSLSocket | None, identity: str) -> str | None:
        """Why the peer of a finished handshake may not act as ``identity`` (None: it may).
        The server admits clients, the sidecar admits servers."""
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if not der:
            return "no peer certificate"
        try:
            peer = sessions.read_credential(der)
        except CertificateError as exc:
            return str(exc)
        return sessions.refusal(peer, identity, self.wall(), self.revoked,
                                client=self.server)
