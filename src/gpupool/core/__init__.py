"""The one model of nodes, GPUs, requests, allocations, classes, groups and quotas.

Pure and deterministic: no Kubernetes client, HTTP, gRPC, asyncio, Prometheus,
wall clock or global random. Time and a seeded ``random.Random`` are passed in.
The extender, node agent, controller and simulator all call this package; none
re-implements fit or scoring.
"""
