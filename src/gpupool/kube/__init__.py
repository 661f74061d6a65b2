"""The one module that talks to the Kubernetes API (through the lightkube client).

* ``api.KubeApi`` — every call gpupool makes: pods (list/watch by node, get,
  annotate with a resourceVersion precondition, bind), nodes, ``GPUDevice``
  (create/update/delete/list/watch, status), ``ResourceClass``,
  ``ResourceGroup`` and ``GPULedger`` (the extender's per-node compare-and-swap
  record).
* ``informer.Informer`` — list + watch as a resilient feed into a handler.
* ``errors`` — ``KubeError`` and its subclasses (``Conflict`` on 409...).
* ``summaries.PodSummary`` — a pod decoded with only the fields gpupool reads.
"""
