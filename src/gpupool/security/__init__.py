"""Pure cryptography for gpupool's trust between components (no I/O, no clock).

* ``signing`` — the extender signs every decision it makes (Ed25519); node agents,
  the extender's rebuild and the controller serve or count only decisions that
  verify against the published public keys.
* ``certs`` — a small certificate authority: the TLS certificates of the extender
  (served to kube-scheduler, mutual TLS), of the admission webhook, and the client
  certificate kube-scheduler presents.

Keys and certificates are stored in Kubernetes Secrets and ConfigMaps by
``gpupool.kube``; this package only makes, reads, writes and checks them.
Time is passed in (seconds since the epoch), never read here.
"""
