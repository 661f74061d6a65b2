"""The node agent's DRA mode: a kubelet DRA plugin for driver ``gpu.gpupool.io``.

* ``registration``: the plugin-watcher handshake on ``plugins_registry/``;
* ``service``: ``DRAPlugin`` v1 and v1beta1 over ``plugins/gpu.gpupool.io/dra.sock``;
* ``preparer``: prepare / unprepare a ResourceClaim (idempotent, checkpointed), with the
  same isolation providers and exposure rules as the device-plugin path;
* ``cdi``: the CDI spec of each prepared claim; ``checkpoint``: what is prepared, on disk;
* ``slices``: the node's ResourceSlice (one device per GPU, consumable capacity);
* ``usage``: prepared claims as the usage monitor's grants; ``pods``: the node's pods and
  the claims their containers use; ``watch``: the monitor's thread (``DraGuards``);
* ``claimsource``: the API calls it makes; ``plugin``: the composition.
"""
