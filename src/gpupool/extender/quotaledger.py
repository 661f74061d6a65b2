"""Quota ledgers: the compare-and-swap record that makes quotas exact across replicas.

Every extender replica checks quotas against its own cache, which lags the other
replicas' binds by the watch latency; the per-node ``GPULedger`` serialises only one
node's GPUs. So each *quota scope* that has a limit gets one cluster-scoped
``QuotaLedger`` object whose entries are the charges of the pods bound under it, keyed
by pod UID and shaped exactly like GPULedger entries (``ledger.Entry``)::

    metadata: {name: tenant.team-a}        # or cohort.<cohort>, group.<group>, namespace.<ns>
    spec:
      scope: tenant team-a
      entries:
        <pod uid>: {pod: ns/name, allocation: ..., bindTime: ..., tenant: ns, class: "", group: ""}

Scopes (``scopes_of``): a TenantQuota outside a cohort is ``tenant.<name>``; one in a
cohort is ``cohort.<cohort>`` (borrowing reads every member's usage, so the whole
cohort is one scope); a ResourceGroup with ``spec.quota`` is ``group.<group>``; a
namespace or (namespace, class) limit of the quota book is ``namespace.<ns>``. A pod
under no limit touches no QuotaLedger.

At bind, after the node's GPULedger entry is written (``binder``), ``QuotaGate.admit``
for each scope in turn: read the scope's ledger (the last version this replica read
or wrote, else a GET), check the charge with the core's arithmetic (``QuotaBook.check``
and ``TenantBook.check`` on the cache's book, with the ledger's live entries that the
book does not know yet charged in for the check), and write the pod's entry with that
resourceVersion as a precondition; a conflict re-reads and re-checks. A refusal, or a
scope that kept changing, removes the entries written so far (the binder then removes
the node entry) and refuses the bind with the quota's reason.

Entries stop counting exactly when the same pod's GPULedger entry would
(``Commitments.prunable``: pod finished or gone, bound elsewhere, pending past the
grace); writers drop them, and ``reconcile`` prunes them every round.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections.abc import Callable, Iterable
from typing import Any

from gpupool.contract import names
from gpupool.core.quota import Charge, amount_of_allocation
from gpupool.extender.cache import ClusterCache
from gpupool.extender.ledger import Entry, View, advanced, view_of
from gpupool.kube.api import KubeApi
from gpupool.kube.errors import AlreadyExists, Conflict, KubeError, NotFound

log = logging.getLogger(__name__)

KIND = "QuotaLedger"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_MAX_NAME = 253


def ledger_name(kind: str, name: str) -> str:
    """The object name of scope ``kind`` ``name``: ``<kind>.<name>``, or ``<kind>.h-<hash>``
    when that is not a valid object name (too long, or a cohort name with other characters)."""
    plain = f"{kind}.{name}"
    if len(plain) <= _MAX_NAME and _NAME.match(plain):
        return plain
    return f"{kind}.h-{hashlib.sha256(name.encode()).hexdigest()[:40]}"


def scopes_of(cache: ClusterCache, charge: Charge) -> dict[str, str]:
    """The QuotaLedgers ``charge`` must be admitted by: object name -> scope (under lock).
    Empty when no limit applies to it."""
    book, out = cache.catalogue.quotas, {}
    t, c, g = charge.tenant, charge.gpu_class, charge.group
    classed = c is not None and (t, c) in book.class_limits
    if t is not None and (t in book.tenant_limits or classed):
        out[ledger_name("namespace", t)] = f"namespace {t}"
    for quota in cache.catalogue.tenants.covering(t):
        if quota.cohort is None:
            out[ledger_name("tenant", quota.name)] = f"tenant {quota.name}"
        else:
            out[ledger_name("cohort", quota.cohort)] = f"cohort {quota.cohort}"
    if g is not None and g in book.group_limits:
        out[ledger_name("group", g)] = f"group {g}"
    return dict(sorted(out.items()))


def charge_of_entry(entry: Entry) -> Charge:
    return Charge(amount_of_allocation(entry.allocation), entry.tenant, entry.gpu_class,
                  entry.group)


class QuotaLedgers:
    """Reads and compare-and-swap writes of QuotaLedger objects; remembers the last
    version of each that it read or wrote (a write from it is the next precondition)."""

    def __init__(self, api: KubeApi):
        self.api = api
        self._lock = threading.Lock()
        self._views: dict[str, View] = {}

    def known(self, name: str) -> View:
        with self._lock:
            view = self._views.get(name)
        return view if view is not None else self.fetch(name)

    def fetch(self, name: str) -> View:
        try:
            view = view_of(self.api.get_quota_ledger(name))
        except NotFound:
            view = View(name)
        return self._remember(View(name, view.resource_version, view.entries))

    def forget(self, name: str) -> None:
        with self._lock:
            self._views.pop(name, None)

    def _remember(self, view: View) -> View:
        with self._lock:
            self._views[view.node] = view
        return view

    def commit(self, view: View, scope: str, uid: str, entry: Entry,
               prune: Iterable[str] = ()) -> View:
        """Add ``entry`` (and drop ``prune``) if the ledger is still at ``view``'s version;
        ``Conflict`` (or ``AlreadyExists``) when it moved on."""
        changes: dict[str, Any] = {u: None for u in prune if u in view.entries and u != uid}
        changes[uid] = entry.to_json()
        if view.resource_version is None:
            obj = {"apiVersion": names.API_VERSION, "kind": KIND,
                   "metadata": {"name": view.node},
                   "spec": {"scope": scope, "entries": {uid: changes[uid]}}}
            written = advanced(View(view.node), {uid: changes[uid]},
                               self.api.create_quota_ledger(obj))
        else:
            try:
                answer = self.api.patch_quota_ledger(
                    view.node, {"spec": {"entries": changes}}, view.resource_version)
            except NotFound:  # deleted since it was read: read it again, as on a conflict
                raise Conflict(f"QuotaLedger {view.node} was deleted", 409) from None
            written = advanced(view, changes, answer)
        return self._remember(View(view.node, written.resource_version, written.entries))

    def prune(self, view: View, uids: Iterable[str]) -> View:
        """Drop ``uids`` if the ledger is still at ``view``'s version (``Conflict`` else)."""
        changes: dict[str, Any] = {u: None for u in uids if u in view.entries}
        if not changes or view.resource_version is None:
            return view
        written = advanced(view, changes, self.api.patch_quota_ledger(
            view.node, {"spec": {"entries": changes}}, view.resource_version))
        return self._remember(View(view.node, written.resource_version, written.entries))

    def remove(self, name: str, uid: str) -> None:
        """Drop ``uid``'s entry (no precondition: the key is the pod's own)."""
        self.forget(name)
        try:
            self.api.patch_quota_ledger(name, {"spec": {"entries": {uid: None}}}, None)
        except NotFound:
            return

    def listed(self) -> list[View]:
        """Every QuotaLedger (none when the kind is not installed)."""
        try:
            objs = self.api.list_quota_ledgers().items
        except NotFound:
            return []
        views = [(view_of(dict(o)), (dict(o).get("metadata") or {}).get("name")) for o in objs]
        # named by the object's name: a hand-written spec.node must not redirect writes
        return [self._remember(View(str(n or v.node), v.resource_version, v.entries))
                for v, n in views]


class QuotaGate:
    """Admits a bind's charge in every quota scope's ledger, or says why not."""

    def __init__(self, cache: ClusterCache, ledgers: QuotaLedgers, attempts: int,
                 on_conflict: Callable[[], None] = lambda: None):
        self.cache = cache
        self.ledgers = ledgers
        self.attempts = attempts
        self.on_conflict = on_conflict

    def admit(self, key: str, entry: Entry) -> tuple[list[str], str]:
        """(ledgers written, '' when admitted else why not). Refused: nothing stays written."""
        charge = charge_of_entry(entry)
        with self.cache.lock:
            scopes = scopes_of(self.cache, charge)
        written: list[str] = []
        for name, scope in scopes.items():
            why = self._admit_in(name, scope, key, entry, charge)
            if why:
                self.roll_back(written, key)
                return [], why
            written.append(name)
        return written, ""

    def _admit_in(self, name: str, scope: str, key: str, entry: Entry, charge: Charge) -> str:
        for _ in range(self.attempts):
            try:
                view = self.ledgers.known(name)
                with self.cache.lock:
                    why = self.refusal(view, key, charge)
                    prune = [u for u in self.cache.quota_prunable(view) if u != key]
                if why:  # the version remembered may be outdated: the next bind reads it
                    self.ledgers.forget(name)
                    return why
                self.ledgers.commit(view, scope, key, entry, prune)
                return ""
            except (Conflict, AlreadyExists):
                self.on_conflict()
                self.ledgers.forget(name)
            except KubeError as exc:
                self.ledgers.forget(name)
                hint = " (is the QuotaLedger CRD applied? deploy/crds/quotaledgers.yaml)" \
                    if isinstance(exc, NotFound) else ""
                return (f"recording the quota charge of {key} in QuotaLedger {name} failed: "
                        f"{exc}{hint}; the scheduler will retry")
        return (f"the quota of {scope} kept changing under {key} ({self.attempts} attempts); "
                "the scheduler will retry")

    def refusal(self, view: View, key: str, charge: Charge) -> str:
        """Why ``charge`` of pod ``key`` does not fit, counting the cache's charges and the
        live entries of ``view`` it does not hold yet ('' when it fits; under lock)."""
        book, tenants = self.cache.catalogue.quotas, self.cache.catalogue.tenants
        stale = set(self.cache.quota_prunable(view))
        mine = book.refund(key)  # the bind's own tentative charge: it is what is asked
        added = [u for u in view.entries if u != key and u not in stale and
                 book.charged(u) is None]
        try:
            for uid in added:
                book.charge(uid, charge_of_entry(view.entries[uid]))
            reason = book.check(charge) or tenants.check(book, charge, key)  # its ask, once
        finally:
            for uid in added:
                book.refund(uid)
            if mine is not None:
                book.charge(key, mine)
        return "" if reason is None else reason.message

    def roll_back(self, written: Iterable[str], key: str) -> None:
        for name in written:
            try:
                self.ledgers.remove(name, key)
            except KubeError as exc:  # stale once the pending grace has passed
                log.warning("removing %s from QuotaLedger %s: %s", key, name, exc)
