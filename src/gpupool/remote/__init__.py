"""Remote GPU slices, the data path: a workload reaches a slice of a GPU on another node.

Process-level pieces, each a thin adapter (docs/remote.md):

* ``server`` — the slice server, one per remote slice on the GPU node: starts the
  data-plane provider (``provider``: pinned to the decided GPU, limited by the node's
  isolation provider, on loopback only) behind gpupool's mutual-TLS terminator, admits
  only its pod's sidecar, heartbeats it, releases the slice when it is gone, and reports
  usage (``usage``) in the node agent's over-use shape;
* ``client`` — the sidecar in the workload's pod: waits for its server, terminates
  mutual TLS toward it, exposes the data plane on loopback, heartbeats the server and
  reports it lost;
* ``credentials`` — per-session certificates and the revocation list, read from files
  and read again when rotated (identities: ``gpupool.security.sessions``);
* ``channel``, ``frames``, ``relay``, ``status`` — what they say to each other;
* ``stub`` — the STUB provider: a stand-in data plane in Python (no GPU), so the whole
  path runs end to end without one.
"""
