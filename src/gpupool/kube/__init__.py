"""The one package that talks to the Kubernetes API, every call through the lightkube client.

* ``api.KubeApi`` — every call gpupool makes: pods (list/watch by node, get,
  annotate with a resourceVersion precondition, bind), nodes, ``GPUDevice``
  (create/update/delete/list/watch, status), ``ResourceClass``,
  ``ResourceGroup`` and ``GPULedger`` (the extender's per-node compare-and-swap
  record).
* ``connection.ApiTransport`` — the httpx transport under lightkube: TCP
  keep-alive, watch reads bounded by the watch's server timeout, a close that
  ends watches, the environment's proxy.
* ``wire.Wire`` — the bind path's Binding and GPULedger calls on lightkube's own
  httpx client, without lightkube's per-call request building.
* ``informer.Informer`` — list + watch as a resilient feed into a handler.
* ``errors`` — ``KubeError`` and its subclasses (``Conflict`` on 409...).
* ``summaries.PodSummary`` — a pod decoded with only the fields gpupool reads.
"""
