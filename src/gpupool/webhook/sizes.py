"""The sizes of the webhook's port: bodies, heads, a request's time, idle connections,
connections held, bytes of bodies held at once, TLS handshakes. Each is a flag of
``gpupool webhook`` (these are the defaults; docs/webhook.md says why each). Kept free of
the server's imports, so that the command's flags are checked before those load."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpupool.http.connections import ConnectionRules

MAX_BODY_BYTES = 8 * 1024 * 1024
"""An AdmissionReview holds the object and the old object (each at most ~1.5 MB in etcd)."""
BODY_BUDGET_BYTES = 4 * MAX_BODY_BYTES
"""Bytes of bodies held at once over all connections: four max-size reviews being read or
judged (about 16 MiB each with its decoded form: 64 MiB over the 96 MiB a replica
needs, well within the chart's 384 MiB), thousands of ordinary ones (a few KiB each)."""
RETRY_AFTER_S = 1
"""A body past the budget: 429 and Retry-After 1; the API server's client retries it
within the webhook's ``timeoutSeconds`` (5 s), then the failure policy applies."""
HEADER_BYTES = 16 * 1024
"""The API server's request head is a few hundred bytes, the kubelet's probe's fewer."""
READ_S = 10.0
"""A whole request, head and ``MAX_BODY_BYTES`` of body, from its first byte: the API
server sends a review at once, and gives up on it after ``timeoutSeconds`` (5 s in the
shipped configurations, 30 s at most)."""
IDLE_S = 30.0
"""The API server keeps its connections alive between reviews; one unused this long
is closed (it reconnects: a TLS handshake, about a millisecond)."""
MAX_CONNECTIONS = 512
"""Reviews in flight at once from every API server, the probes and room to spare, within
the 1,024 file descriptors a container commonly gets (the Kubernetes client's own
connections use others)."""
HANDSHAKE_S = 5.0
"""A TLS handshake takes about a millisecond on a cluster network; one not done in this
time is closed (the API server's own call is given 5 s)."""
MAX_HANDSHAKES = 64
"""Handshakes in progress at once: a rolling restart of every API server reconnects a few
dozen at most; past this the oldest is closed (its file descriptor counts too)."""
GRACEFUL_S = 5  # reviews in flight at shutdown: answered within this


@dataclass(frozen=True, slots=True)
class Sizes:
    """The port's sizes (``gpupool webhook``'s flags; the defaults above)."""

    header_bytes: int = HEADER_BYTES
    read_s: float = READ_S
    idle_s: float = IDLE_S
    max_connections: int = MAX_CONNECTIONS
    max_body_bytes: int = MAX_BODY_BYTES
    body_budget_bytes: int = BODY_BUDGET_BYTES
    handshake_s: float = HANDSHAKE_S
    max_handshakes: int = MAX_HANDSHAKES

    def rules(self) -> ConnectionRules:
        from gpupool.http.connections import ConnectionRules
        from gpupool.http.handshakes import HandshakeRules

        return ConnectionRules(idle_s=self.idle_s, read_s=self.read_s,
                               header_bytes=self.header_bytes,
                               max_connections=self.max_connections, recycle=True,
                               handshakes=HandshakeRules(self.handshake_s,
                                                         self.max_handshakes))
