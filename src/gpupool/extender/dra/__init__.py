"""Pods whose GPUs come from ResourceClaims: their claims read into core requests
(``drapods``) and into what the allocator would select (``draasks``, ``draselect``), the
quota a claim may take on a node (``draquota``), and the ``filter-claims`` and
``prioritize-claims`` verbs (``drafilter``, ``drascores``) over the extender they are given
(``host``). The claims and slices themselves are kept in ``state``."""
