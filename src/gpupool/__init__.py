"""gpupool: share and pack the GPUs of a Kubernetes cluster.

Layers (imports only point downwards):

* ``gpupool.core``      pure, deterministic model and placement policies
* ``gpupool.sim``       trace-driven simulator over the core
* ``gpupool.contract``  pure codecs for the names users and components exchange
* adapters: ``gpupool.extender``, ``gpupool.nodeagent``, ``gpupool.controller``,
  ``gpupool.kube`` (the one module that talks to the Kubernetes API)
* ``gpupool.cli``       the one composition root
"""

__version__ = "0.1.0"
