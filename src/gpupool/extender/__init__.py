"""The kube-scheduler HTTP extender: filter, prioritize and bind decided by the core.

* ``podspec`` — pod JSON -> ``PodRequest`` (the edge);
* ``inventory`` — Nodes, GPUDevices, ResourceClasses, ResourceGroups -> core values;
* ``pods`` — what the cache keeps of each watched pod;
* ``cache`` — ``ClusterCache``: one lock, one ``ClusterState``, fed by ``feeds``;
* ``ledger`` — the per-node GPULedger compare-and-swap that keeps replicas honest;
* ``service`` — ``Extender``: the filter / prioritize / preempt decisions, and
  bind through ``binder.Binder``; ``refusals`` — filter's cached explanations;
* ``feeds`` — the informers that keep the cache in step, in rebuild order;
* ``server`` — uvicorn on a thread (loopback tests, benchmarks);
* ``protocol`` — the extender wire format; ``app`` — the starlette app;
* ``metrics`` — Prometheus metrics; ``workload`` — FGD's target workload.

Design: docs/design/extender.md; wire and annotations: docs/protocol.md.
"""
