"""Isolation providers: what enforces a GPU slice's limits on this node.

Chosen per node (``--isolation-provider``, or the node label
``gpupool.io/isolation-provider`` when the flag says ``auto``):

* ``mps`` (``mps``): the agent runs and supervises one CUDA MPS control daemon per
  GPU and sets per-client limits in the daemon, where MPS enforces them;
* ``hami-core`` (``hamicore``): the open-source HAMi-core interposer, when installed
  on the node: its library is preloaded into shared containers (``/etc/ld.so.preload``)
  with its memory and SM limits per container;
* ``none`` (``none``): advisory only — the slice is described to the container and
  watched by the usage monitor, but nothing on the GPU enforces it.

What each guarantees, and what it does not, is in docs/node-agent.md.
"""
