"""The controller: keeps gpupool's custom resources in line with the cluster.

* ``observed`` — listed objects -> values (GPUs from GPUDevices, decisions from
  pod annotations); broken objects become ``Problem``s, never exceptions.
* ``resources`` — ResourceClass / ResourceGroup specs -> core values, or why not.
* ``defaults`` — one default ResourceClass per GPU model, marked as owned.
* ``status`` — conditions, quota amounts as JSON, merge-patch diffs.
* ``reconcile`` — pure: ``Observed`` -> ``Plan`` (creates, patches, statuses).
* ``loop`` — ``Controller``: list + watch through ``gpupool.kube``, apply plans.

See docs/controller.md.
"""
