"""Trace-driven simulator: replays workloads through the core, one pod at a time.

Readers (``trace`` for the Alibaba GPU trace CSVs, ``native`` for gpupool's own
YAML, ``synthetic`` for the built-in cluster and workload) translate their input
into core types at the edge and hand a ``Scenario`` to the runs: ``protocol``
(the FGD paper's evaluation protocol) and ``timed`` (creation and deletion
times honoured). ``campaign`` runs many (policy, seed) pairs; ``report`` writes
the summary, the curves and the plot. The core never sees a CSV row.
"""
