"""The cluster as the extender holds it: ``ClusterCache`` (one lock, one ``ClusterState``)
fed by the informers in ``feeds``; what it keeps of nodes and GPUDevices (``inventory``),
pods (``pods``), PodDisruptionBudgets (``budgets``), DRA claims and node modes
(``draclaims``, ``dramodes``); the per-node GPULedger records (``ledger``), reservations
(``holdings``, ``commitments``) and which pod decisions it believes (``signatures``)."""
