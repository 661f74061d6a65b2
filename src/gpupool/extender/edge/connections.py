"""The extender's connection rules over ``gpupool.http.connections`` (shared with the
webhook): the verbs' port takes ``ConnectionRules()`` (its defaults are the verbs'),
and ``PROBE_RULES`` are the probe port's: few connections, recycled (anyone the network
lets in can open connections there, and the kubelet's probe must always get one; it
opens a new connection per probe), closed after ``PROBE_IDLE_S`` idle."""

from gpupool.http.connections import (
    HEADER_BYTES,
    MAX_CONNECTIONS,
    ConnectionRules,
    GuardedHttp,
    allowed,
    guarded_protocol,
)

PROBE_CONNECTIONS = 64  # the kubelet's probes, Prometheus, and room to spare
PROBE_IDLE_S = 2.0  # the kubelet does not keep probe connections; Prometheus reconnects
PROBE_HEADER_BYTES = 8 * 1024  # GET /healthz, /readyz, /metrics

PROBE_RULES = ConnectionRules(idle_s=PROBE_IDLE_S, read_s=PROBE_IDLE_S,
                              header_bytes=PROBE_HEADER_BYTES,
                              max_connections=PROBE_CONNECTIONS, recycle=True)

__all__ = ["HEADER_BYTES", "MAX_CONNECTIONS", "PROBE_CONNECTIONS", "PROBE_HEADER_BYTES",
           "PROBE_IDLE_S", "PROBE_RULES", "ConnectionRules", "GuardedHttp", "allowed",
           "guarded_protocol"]
