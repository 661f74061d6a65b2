"""The kube-scheduler HTTP extender: filter, prioritize, bind and preempt decided by the core.

Rooms by stage, each importing only the rooms below it (tests/test_layers.py checks it):

* ``edge/`` — the HTTP apps, their server, connections, TLS and body limits;
* ``service`` — ``Extender``: filter, prioritize, bind and preempt, composed from the rooms
  below; ``workload`` — FGD's target workload; ``metrics`` — Prometheus metrics;
* ``bind/`` — bind's gate, ledger compare-and-swap and reconciliation;
  ``preemption/`` — choosing and evicting victims; ``dra/`` — pods with ResourceClaims;
* ``tenancy/`` — the QuotaLedgers and the tenants' gauges;
* ``state/`` — ``ClusterCache`` and what feeds it: inventory, pods, GPULedgers, claims;
* ``wire/`` — kube-scheduler's bodies and node names, pods' requests, filter's reasons.

Design: docs/design/extender.md; wire and annotations: docs/protocol.md.
"""
