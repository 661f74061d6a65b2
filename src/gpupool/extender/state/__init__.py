"""The cluster as the extender holds it: ``ClusterCache`` (one lock, one ``ClusterState``)
fed by the informers in ``feeds``; what it keeps of nodes and GPUDevices (``inventory``),
pods (``pods``), PodDisruptionBudgets (``budgets``), DRA claims and node modes
(``draclaims``, ``dramodes``), gangs and their members (``gangs``); the per-node
GPULedger records (``ledger``), reservations (``holdings``, ``commitments``), the
placements handed to bind until it comes (``assumptions``), which pod decisions it
believes (``signatures``), and the turns its binds take on one record (``turns``)."""
