"""Keeping the GPULedger objects in step with the live pods, at start and then every sweep.

The cache stops holding a stale entry at once (``commitments``); the objects are put
right here, so that ``kubectl get gpuledger`` shows what nodes really hold and other
replicas need not work it out again:

* an entry whose pod this replica has not seen ``unknown_after_s`` after its bind time
  (its pod event lags, or the pod vanished without one, e.g. a bind whose Binding
  failed and whose extender died before it could remove the entry) is checked against
  the API server: a pod that is not there, or is another pod under the same name, is
  gone, and the entry holds nothing from then on;
* stale entries are removed from each ledger with a merge patch that carries the
  resourceVersion they were judged at (a ledger that moved on meanwhile is left for
  the next round: an entry written since may be a bind in flight).

* the QuotaLedgers (``quotaledger``) are listed, and their stale entries — by the very
  rule that makes a GPULedger entry stale — removed the same way.

Each round makes at most ``max_calls`` API calls, so a large backlog is worked off over
a few rounds instead of in one burst.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.state.ledger import Ledgers
from gpupool.extender.tenancy.quotaledger import QuotaLedgers
from gpupool.kube.api import KubeApi
from gpupool.kube.errors import Conflict, KubeError, NotFound

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Reconciled:
    """What one round did."""

    gone: int = 0
    pruned: int = 0
    ledgers: int = 0
    quota_pruned: int = 0  # entries removed from QuotaLedgers


class LedgerReconciler:
    def __init__(self, cache: ClusterCache, kube: KubeApi, unknown_after_s: float = 10.0,
                 max_calls: int = 100, quota_ledgers: QuotaLedgers | None = None):
        """``quota_ledgers``: the binder's, so that what a prune writes is the version its
        next bind in that scope writes against (its own copy would conflict once)."""
        self.cache = cache
        self.kube = kube
        self.ledgers = Ledgers(kube)
        self.quota_ledgers = quota_ledgers or QuotaLedgers(kube)
        self.unknown_after_s = unknown_after_s
        self.max_calls = max_calls

    def run_once(self) -> Reconciled:
        gone, calls = self._check_unknown()
        pruned = ledgers = 0
        for node, uids in sorted(self.cache.stale_by_node().items()):
            if calls >= self.max_calls:
                break
            calls += 1
            view = self.cache.ledgers.get(node)
            if view is None:
                continue
            try:
                self.cache.ledger_update(self.ledgers.prune(view, uids))
            except (Conflict, NotFound):
                continue
            except KubeError as exc:
                log.warning("pruning the GPU ledger of %s: %s", node, exc)
                continue
            pruned, ledgers = pruned + len(uids), ledgers + 1
        if gone or pruned:
            log.info("GPU ledgers reconciled: %d entries of pods that are gone, %d stale "
                     "entries removed from %d ledgers", gone, pruned, ledgers)
        quota_pruned = self._prune_quota_ledgers(calls) if calls < self.max_calls else 0
        return Reconciled(gone, pruned, ledgers, quota_pruned)

    def _prune_quota_ledgers(self, calls: int) -> int:
        """Stale entries removed from QuotaLedgers (one listing, then a patch per ledger)."""
        try:
            views = self.quota_ledgers.listed()
        except KubeError as exc:
            log.warning("listing the QuotaLedgers: %s", exc)
            return 0
        pruned = 0
        for view in views:
            with self.cache.lock:
                uids = self.cache.quota_prunable(view)
            if not uids or calls + 1 >= self.max_calls:
                continue
            calls += 1
            try:
                self.quota_ledgers.prune(view, uids)
            except (Conflict, NotFound):
                self.quota_ledgers.forget(view.node)
                continue
            except KubeError as exc:
                log.warning("pruning QuotaLedger %s: %s", view.node, exc)
                continue
            pruned += len(uids)
        if pruned:
            log.info("QuotaLedgers reconciled: %d stale entries removed", pruned)
        return pruned

    def _check_unknown(self) -> tuple[int, int]:
        gone = calls = 0
        for uid, namespace, name in self.cache.unknown_entries(self.unknown_after_s):
            if calls >= self.max_calls:
                break
            calls += 1
            try:
                pod = self.kube.get_pod(namespace, name)
                here = pod.metadata is not None and pod.metadata.uid == uid
            except NotFound:
                here = False
            except KubeError as exc:
                log.warning("checking pod %s/%s of a GPU ledger entry: %s", namespace, name, exc)
                continue
            if not here:
                self.cache.forget_gone(uid)
                gone += 1
        return gone, calls
