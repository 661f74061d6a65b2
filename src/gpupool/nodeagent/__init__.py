"""The node agent: gpupool's kubelet device plugin.

It discovers the node's GPUs (``nvml`` or the ``fakegpus`` file), keeps their
health (``health``), advertises several logical devices per physical GPU to
kubelet (``logical``, ``server``), publishes one ``GPUDevice`` per GPU
(``inventory``) and serves Allocate from the extender's decision
(``handshake``, ``allocator``). ``agent`` wires these together; only the CLI
reads flags. See docs/node-agent.md.
"""
