"""Bind: which pods the extender may bind (``gate``), the GPULedger compare-and-swap, quota
charge and signed Binding of one pod (``binder``), the ledger writes its binds share
(``ledgerbatch``), a gang's members placed together and held in the GPULedgers until they
bind (``gangholds``), and keeping the GPULedger and QuotaLedger objects in step with the
live pods (``reconcile``)."""
