"""The one module that talks to the Kubernetes API (through the lightkube client).

* ``api.KubeApi`` — every call gpupool makes: pods (list/watch by node, get,
  annotate with a resourceVersion precondition, bind), nodes, ``GPUDevice``
  (create/update/delete/list/watch, status), ``ResourceClass``,
  ``ResourceGroup`` and ``GPULedger`` (the extender's per-node compare-and-swap
  record).
* ``informer.Informer`` — list + watch as a resilient feed into a handler.
* ``errors`` — ``KubeError`` and its subclasses (``Conflict`` on 409...).
* ``fake_apiserver.FakeApiServer`` — a FAKE in-memory API server on 127.0.0.1
  for tests and benchmarks (the one test seam in front of the real API), over
  ``fake_store.Store`` (objects, watch history, selectors, merge patch).
* ``summaries.PodSummary`` — a pod decoded with only the fields gpupool reads.
"""
