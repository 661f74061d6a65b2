"""What the nodes' GPULedgers commit, as the cluster cache holds it, and when an entry
stops holding anything.

Every bind writes its pod's entry into the node's GPULedger before the Binding
(``binder``), so an entry can outlive its purpose: the pod was deleted, it was bound
to another node, or the extender died between the ledger write and the Binding and
the pod is still pending. An entry is *stale* (held by nobody, dropped by the next
writer of that ledger, ``prunable``) when

* its pod is known to be gone: deleted or finished, or — **reconciled at once after a
  restart** — listed in a ledger listing and absent from a pod listing made after it
  (a pod exists before its entry is written, and UIDs are never reused);
* its pod is bound to another node;
* its pod is pending, unbound, and the entry is older than ``pending_grace_s`` (60 s:
  longer than a bind may take, ``binder.BIND_DEADLINE_S`` plus the Binding's own
  timeout; younger, it may be another replica's bind in flight);
* its pod is unknown to this replica (its pod event lags, or it vanished without
  one) for ``ledger_grace_s``; ``reconcile.LedgerReconciler`` asks the API server
  about such pods long before that.

A *hold* (an entry of kind ``hold``: room a preemption makes for a pending pod,
``ledger``) holds nothing once it ``expires``, once its pod is bound (its bind replaced it,
or it went elsewhere), or once its pod is gone. Until then it is held like any entry
(waiting, in the state, until its victims leave), ``holds`` indexes it, and the pods it
``displaces`` are no one else's to preempt (``displaced``).

A pending pod's own entry never stands in the way of that pod: bind re-decides it
(``readopt``: the pod's tentative holds are let go and its new entry replaces the
old one; ``restore`` holds them again when the bind fails) and filter and prioritize look
at the state without it (``without``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Set
from contextlib import contextmanager
from typing import Any

from gpupool.core.allocation import Allocation
from gpupool.core.eligibility import Catalogue
from gpupool.core.quota import Charge, amount_of_allocation
from gpupool.core.state import ClusterState
from gpupool.extender.state import ledger
from gpupool.extender.state.assumptions import ASSUME
from gpupool.extender.state.holdings import Holdings
from gpupool.extender.state.pods import PodFacts

log = logging.getLogger(__name__)

MEMO_LIMIT = 500_000  # decoded ledger entries kept for reuse
PENDING_GRACE_S = 60.0
TENTATIVE = (ASSUME, "bind", "ledger", "load")  # what a pending pod may hold before its
# Binding


class Commitments(Holdings):
    """Ledger views by node, their entries held in the state; base of ``ClusterCache``."""

    def __init__(self, state: ClusterState, catalogue: Catalogue, clock: Callable[[], float],
                 ledger_grace_s: float, pending_grace_s: float = PENDING_GRACE_S):
        super().__init__(state, catalogue)
        self.lock = threading.RLock()
        self.clock = clock
        self.ledger_grace_s = ledger_grace_s
        self.pending_grace_s = pending_grace_s
        self.pods: dict[str, PodFacts] = {}
        self.ledgers: dict[str, ledger.View] = {}
        self.entry_node: dict[str, str] = {}  # pod uid -> a node whose ledger holds it
        self.entry_more: dict[str, set[str]] = {}  # ... and the others (rare: crash leftovers)
        self.listed_entries: set[str] = set()  # uids of the last ledger listing
        self.holds: dict[str, str] = {}  # pod uid -> the node whose ledger has its hold
        self.entry_memo: dict[tuple[str, str], ledger.Entry] = {}
        self.synced: set[str] = set()

    # -- ledgers as read ------------------------------------------------------------------------
    def sync_ledgers(self, objs: Iterable[dict[str, Any]]) -> None:
        with self.lock:
            views = [ledger.view_of(o, self.entry_memo) for o in objs]
            gone = set(self.ledgers) - {v.node for v in views}
            for node in gone:
                self.ledger_update(ledger.View(node))
            for view in views:
                self.ledger_update(view)
            self.listed_entries = {uid for v in views for uid in v.entries}
            self.synced.add("ledgers")

    def ledger_event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind != "DELETED" and self._holds_version(obj):
            return  # typically this replica's own write, taken in when its bind wrote it
        if len(self.entry_memo) > MEMO_LIMIT:
            self.entry_memo = {}
        view = ledger.view_of(obj, self.entry_memo)
        with self.lock:
            self.ledger_update(ledger.View(view.node) if kind == "DELETED" else view)

    def ledger_update(self, view: ledger.View) -> None:
        """Take in a ledger as read (watch, bind, or conflict); stale versions are ignored."""
        with self.lock:
            old = self.ledgers.get(view.node)
            if old is not None and view.resource_version and old.resource_version and int(
                    view.resource_version) <= int(old.resource_version):
                return  # a version taken in already (the watch and the bind both bring it)
            self.ledgers[view.node] = view
            before = set(old.entries) if old else set()
            for uid in before - set(view.entries):
                self._entry_gone(uid, view.node)
                self.unhold(uid, "ledger")
            for uid in set(view.entries) - before:
                self._entry_added(uid, view.node)
            self._index_holds(view, before)
            if view.node in self.state.index:
                self._hold_ledger(view)

    def _index_holds(self, view: ledger.View, before: Set[str]) -> None:
        for uid in before - set(view.entries):
            if self.holds.get(uid) == view.node:
                del self.holds[uid]
        for uid, entry in view.entries.items():
            if entry.is_hold:
                self.holds[uid] = view.node
            elif self.holds.get(uid) == view.node:
                del self.holds[uid]

    def _entry_added(self, uid: str, node: str) -> None:
        first = self.entry_node.setdefault(uid, node)
        if first != node:
            self.entry_more.setdefault(uid, set()).add(node)

    def _entry_gone(self, uid: str, node: str) -> None:
        more = self.entry_more.get(uid)
        if self.entry_node.get(uid) == node:
            if more:
                self.entry_node[uid] = more.pop()
            else:
                self.entry_node.pop(uid, None)
        elif more is not None:
            more.discard(node)
        if more is not None and not more:
            del self.entry_more[uid]

    def _holds_version(self, obj: dict[str, Any]) -> bool:
        """Whether the ledger ``obj`` is at a version this cache already took in (or an
        older one): nothing to decode. Read without the lock: a ``View`` is immutable and
        the versions of one ledger only grow."""
        meta, spec = obj.get("metadata"), obj.get("spec")
        if not isinstance(meta, dict) or not isinstance(spec, dict):
            return False
        rv = meta.get("resourceVersion")
        held = self.ledgers.get(str(spec.get("node") or meta.get("name") or ""))
        if held is None or not isinstance(rv, str) or not rv.isdigit():
            return False
        return (held.resource_version or "").isdigit() and int(rv) <= int(
            held.resource_version or "")

    def _hold_ledger(self, view: ledger.View) -> None:
        """Hold the live entries of ``view``. An entry whose key already holds an
        allocation as ``ledger`` is passed over: ``hold`` would change nothing for it
        (the same allocation gains the source it has, another is refused), so a write of
        one entry costs one hold, not one per entry of the node."""
        now = self.clock()
        held = self.state.allocations
        for uid, entry in view.entries.items():
            if uid in held and "ledger" in self.sources.get(uid, ()):
                continue
            if not self._stale_entry(uid, entry, now):
                self.hold(entry.allocation, "ledger", self._entry_charge(entry))

    def _entry_charge(self, entry: ledger.Entry) -> Charge:
        return Charge(amount_of_allocation(entry.allocation), entry.tenant, entry.gpu_class,
                      entry.group)

    # -- which entries hold nothing -----------------------------------------------------------
    def _stale_entry(self, uid: str, entry: ledger.Entry, now: float) -> bool:
        """An entry that holds nothing any more (the module's docstring says when)."""
        if uid in self.finished:
            return True
        pod = self.pods.get(uid)
        if entry.is_hold:  # a bound pod's bind replaced or superseded it
            expires = entry.expires_s
            return (pod is not None and bool(pod.node)) or expires is None or now > expires
        bound = entry.bind_s
        if pod is not None:
            if pod.node:
                return pod.node != entry.allocation.node
            return bound is None or now - bound > self.pending_grace_s
        # a pod this cache has never seen: gone once the grace has passed since its bind;
        # an entry with no readable bind time (gpupool always writes one: a hand edit, a
        # restored backup) can never age, so it is judged only by whether the pod exists
        aged = bound is None or now - bound > self.ledger_grace_s
        return aged and "pods" in self.synced

    def prunable(self, view: ledger.View) -> list[str]:
        """Entries of ``view`` a writer may drop (under ``lock``)."""
        now = self.clock()
        return [u for u, e in view.entries.items() if self._stale_entry(u, e, now)]

    def quota_prunable(self, view: ledger.View) -> list[str]:
        """Entries of a QuotaLedger ``view`` a writer may drop (under ``lock``): the stale
        ones, and those of pods this cache has seen bound where the entry says for longer
        than the pending grace. Every replica's watch has shown those pods by then, so
        their caches charge them from the pods themselves; the ledger only has to carry
        the binds the others may not have seen yet, which keeps it small."""
        now = self.clock()
        return [u for u, e in view.entries.items() if self._stale_entry(u, e, now) or
                self._seen_bound(u, e, now)]

    def _seen_bound(self, uid: str, entry: ledger.Entry, now: float) -> bool:
        pod = self.pods.get(uid)
        bound = entry.bind_s
        return (pod is not None and pod.node == entry.allocation.node and bound is not None
                and now - bound > self.pending_grace_s)

    def release_stale_entries(self) -> None:
        """Let go of the holds of entries that turned stale by age (under ``lock``)."""
        now = self.clock()
        for view in self.ledgers.values():
            for uid, entry in view.entries.items():
                if self._stale_entry(uid, entry, now):
                    self.unhold(uid, "ledger")

    def reconcile_listing(self, present: Set[str]) -> list[str]:
        """After a pod listing (``present``: the uids it holds): the entries of the last
        ledger listing whose pods it does not hold are of pods that are gone (the ledger was
        listed first); they are freed at once. Returns their uids (under ``lock``)."""
        gone = [uid for uid in self.listed_entries if uid not in present]
        for uid in gone:
            self._finish(uid)
        self.listed_entries = set()
        return gone

    # -- a pending pod's own tentative holds ------------------------------------------------------
    def readopt(self, key: str, node: str | None = None) -> None:
        """Let go of what a pending pod holds before its Binding (its assumption, a bind in
        flight, its ledger entries, its CPU and memory) so its decision can be made again,
        by its bind to ``node`` (under ``lock``). Its entries stay in the ledger objects
        until replaced or pruned; they are not held again while the pod's new bind holds
        another allocation."""
        assumed = self.assumptions.node_of(key)
        if assumed is not None:
            self.unassume(key, "bound" if assumed == node else "moved")
        for source in TENTATIVE:
            self.unhold(key, source)

    @contextmanager
    def without(self, key: str) -> Iterator[None]:
        """The state without the tentative hold of pending pod ``key`` for the block (its
        own leftover entry must not keep it off a node); the very same allocation is held
        again after. Nothing else can take the room meanwhile: the caller holds ``lock``."""
        sources = self.sources.get(key)
        held: Allocation | None = None
        charge = None  # its quota charge goes aside with it (its own hold is no usage)
        if sources and "pod" not in sources:
            held = self.state.release(key)
            charge = self.catalogue.quotas.refund(key) if held is not None else None
        try:
            yield
        finally:
            if held is not None:
                self.state.reserve(held)
            if charge is not None:
                self.catalogue.quotas.charge(key, charge)

    def restore(self, key: str) -> None:
        """Hold again pending pod ``key``'s preemption holds (its bind failed after
        ``readopt`` let them go; the room must stay the pod's until the hold expires)."""
        now = self.clock()
        for node in sorted(self.entry_nodes_of(key)):
            view = self.ledgers.get(node)
            entry = view.entries.get(key) if view is not None else None
            if entry is not None and entry.is_hold and not self._stale_entry(key, entry, now):
                self.hold(entry.allocation, "ledger", self._entry_charge(entry))

    def live_hold(self, key: str) -> tuple[str, ledger.Entry] | None:
        """(node, entry) of pod ``key``'s hold that still holds room (under ``lock``)."""
        node = self.holds.get(key)
        view = self.ledgers.get(node) if node is not None else None
        entry = view.entries.get(key) if view is not None else None
        if node is None or entry is None or self._stale_entry(key, entry, self.clock()):
            return None
        return node, entry

    def displaced(self) -> set[str]:
        """Pods the live holds displace: victims of preemptions under way (under ``lock``)."""
        out: set[str] = set()
        for key in list(self.holds):
            found = self.live_hold(key)
            if found is not None:
                out.update(found[1].displaces)
        return out

    def entry_nodes_of(self, key: str) -> set[str]:
        """The nodes whose ledger holds an entry of ``key``."""
        with self.lock:
            first = self.entry_node.get(key)
            return set() if first is None else {first, *self.entry_more.get(key, ())}

    def stale_by_node(self) -> Mapping[str, list[str]]:
        """Per ledger, its stale entries (what ``reconcile`` prunes)."""
        with self.lock:
            out = {node: self.prunable(view) for node, view in self.ledgers.items()}
        return {node: uids for node, uids in out.items() if uids}

    def unknown_entries(self, older_than_s: float) -> list[tuple[str, str, str]]:
        """(uid, namespace, name) of entries whose pods this cache has not seen, written
        more than ``older_than_s`` ago (for the reconciler to ask the API server about)."""
        now = self.clock()
        out = []
        with self.lock:
            for view in self.ledgers.values():
                for uid, e in view.entries.items():
                    if uid in self.pods or uid in self.finished or e.bind_s is None or \
                            now - e.bind_s < older_than_s or "/" not in e.pod:
                        continue
                    ns, name = e.pod.split("/", 1)
                    out.append((uid, ns, name))
        return out

    def forget_gone(self, uid: str) -> None:
        """A pod the API server says is gone: its entries hold nothing from now on."""
        with self.lock:
            if uid not in self.pods:
                self._finish(uid)
