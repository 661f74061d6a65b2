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
for each scope in turn (this replica's binds in one scope take turns, and whoever has
the turn writes the charges of every bind that waited for it in one write,
``turns.Batches``, so they neither lose the compare-and-swap to each other nor pass one
per round trip): read the scope's ledger (the last version this replica read or wrote,
else a GET), check each charge with the core's arithmetic (``QuotaBook.check`` and
``TenantBook.check`` on the cache's book, which holds every bind in flight, with the
ledger's live entries that the book does not know yet charged in for the check), and
write the entries of those that fit with that resourceVersion as a precondition; a
conflict re-reads and re-checks. A refusal, or a scope that kept changing, removes the
entries written so far (the binder then removes the node entry) and refuses the bind
with the quota's reason.

A head holding ``move_at`` entries moves them to shards (``shard-<k>.<head>``), so no
object outgrows what the API server stores; admission reads the head and every shard it
names, and still writes only the head (``quotashards`` says why that stays exact).

Entries stop counting exactly when the same pod's GPULedger entry would
(``Commitments.prunable``: pod finished or gone, bound elsewhere, pending past the
grace); writers drop them, and ``reconcile`` prunes them every round.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from gpupool.contract import names
from gpupool.core.quota import Charge, amount_of_allocation
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.state.ledger import Entry, View, advanced, merge_changes, view_of
from gpupool.extender.state.turns import Batches
from gpupool.extender.tenancy.quotashards import (
    MOVE_AT_ENTRIES,
    SHARD_BYTES,
    Marks,
    Unreadable,
    chunk,
    marks_of,
    shard_index,
    shard_name,
    size_of,
    strict_view,
    union,
)
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
    """Reads and compare-and-swap writes of QuotaLedger objects (heads and their shards,
    ``quotashards``); remembers the last version of each that it read or wrote (a write
    from it is the next precondition)."""

    def __init__(self, api: KubeApi, move_at: int = MOVE_AT_ENTRIES,
                 shard_bytes: int = SHARD_BYTES):
        self.api = api
        self.move_at = move_at
        self.shard_bytes = shard_bytes
        self._lock = threading.Lock()
        self._views: dict[str, tuple[View, Marks]] = {}
        self._sizes: dict[str, tuple[str | None, int]] = {}

    def known(self, name: str) -> View:
        return self.state(name)[0]

    def state(self, name: str) -> tuple[View, Marks]:
        """The version remembered (a GET when none); ``Unreadable`` when malformed."""
        with self._lock:
            got = self._views.get(name)
        return got if got is not None else self._fetch(name)

    def _fetch(self, name: str) -> tuple[View, Marks]:
        try:
            obj = self.api.get_quota_ledger(name)
        except NotFound:
            return self._remember(View(name), Marks())
        return self._remember(_named(view_of(obj), name), marks_of(obj))

    def forget(self, name: str) -> None:
        with self._lock:
            self._views.pop(name, None)

    def _remember(self, view: View, marks: Marks) -> tuple[View, Marks]:
        with self._lock:
            self._views[view.node] = (view, marks)
        return view, marks

    def shard(self, name: str, head: str, seq: int) -> View:
        """Shard ``name`` of ``head`` at a version holding move ``seq`` at least (a GET when
        the one remembered is older); ``Unreadable`` when it cannot be read or decoded."""
        with self._lock:
            got = self._views.get(name)
        if got is not None and got[1].seq >= seq and got[1].head == head:
            return got[0]
        try:
            obj = self.api.get_quota_ledger(name)
        except NotFound:  # deleted by hand: its charges are gone, as with a deleted head
            return self._remember(View(name), Marks(seq=seq, head=head))[0]
        except KubeError as exc:
            raise Unreadable(f"reading QuotaLedger {name}: {exc}") from None
        view, marks = self._remember(strict_view(obj, name, head), marks_of(obj))
        if marks.seq < seq:
            raise Unreadable(f"QuotaLedger {name} holds moves up to {marks.seq}, but "
                             f"{head} records move {seq} there")
        return view

    def whole(self, head: View, marks: Marks) -> View:
        """Every entry of the scope of ``head`` (its shards included), at its version."""
        return union(head, [self.shard(n, head.node, q) for n, q in sorted(marks.shards.items())])

    def commit(self, view: View, scope: str, uid: str, entry: Entry,
               prune: Iterable[str] = ()) -> View:
        """Add ``entry`` (and drop ``prune``) if the ledger is still at ``view``'s version;
        ``Conflict`` (or ``AlreadyExists``) when it moved on."""
        return self.commit_all(view, scope, {uid: entry}, prune)

    def commit_all(self, view: View, scope: str, entries: Mapping[str, Entry],
                   prune: Iterable[str] = ()) -> View:
        """``commit`` of several pods' entries in one write."""
        changes = merge_changes(view, entries, prune)
        if view.resource_version is None:
            fresh = {uid: changes[uid] for uid in entries}
            obj = {"apiVersion": names.API_VERSION, "kind": KIND,
                   "metadata": {"name": view.node},
                   "spec": {"scope": scope, "entries": fresh}}
            answer = self.api.create_quota_ledger(obj)
            written = advanced(View(view.node), fresh, answer)
        else:
            try:
                answer = self.api.patch_quota_ledger(
                    view.node, {"spec": {"entries": changes}}, view.resource_version)
            except NotFound:  # deleted since it was read: read it again, as on a conflict
                raise Conflict(f"QuotaLedger {view.node} was deleted", 409) from None
            written = advanced(view, changes, answer)
        return self._remember(_named(written, view.node), marks_of(answer))[0]

    def prune(self, view: View, uids: Iterable[str]) -> View:
        """Drop ``uids`` if the ledger is still at ``view``'s version (``Conflict`` else)."""
        changes: dict[str, Any] = {u: None for u in uids if u in view.entries}
        if not changes or view.resource_version is None:
            return view
        answer = self.api.patch_quota_ledger(
            view.node, {"spec": {"entries": changes}}, view.resource_version)
        return self._remember(_named(advanced(view, changes, answer), view.node),
                              marks_of(answer))[0]

    def remove(self, name: str, *uids: str) -> None:
        """Drop the entries of ``uids`` from head ``name`` and the shards remembered holding
        one (no precondition: the keys are the pods' own)."""
        with self._lock:
            shards = [n for n, (v, m) in self._views.items() if m.head == name and
                      any(u in v.entries for u in uids)]
        for target in [name, *shards]:
            self.forget(target)
            try:
                self.api.patch_quota_ledger(target, {"spec": {"entries": dict.fromkeys(uids)}},
                                            None)
            except NotFound:
                continue

    def listed(self) -> list[View]:
        """Every QuotaLedger, heads and shards (none when the kind is not installed)."""
        try:
            objs = [dict(o) for o in self.api.list_quota_ledgers().items]
        except NotFound:
            return []
        views = []
        for obj in objs:
            # named by the object's name: a hand-written spec.node must not redirect writes
            name = str((obj.get("metadata") or {}).get("name") or "")
            try:
                views.append(self._remember(_named(view_of(obj), name), marks_of(obj))[0])
            except Unreadable as exc:
                log.warning("%s", exc)
        return views

    # -- moving a full head's entries to a shard (quotashards) ----------------------------
    def spread(self, head: View, scope: str) -> None:
        """Move entries of ``head`` to shards while it holds ``move_at`` or more (best
        effort: a move that loses a race is left for a later bind; entries caught in two
        objects count once)."""
        for _ in range(8):
            if len(head.entries) < self.move_at:
                return
            try:
                moved = self._move(head, self.state(head.node)[1], scope)
            except (KubeError, Unreadable) as exc:
                log.info("moving QuotaLedger %s entries to a shard: %s", head.node, exc)
                self.forget(head.node)
                return
            if moved is None:
                return
            head = moved

    def _move(self, head: View, marks: Marks, scope: str) -> View | None:
        name, shard, room = self._target(head, marks)
        moved = chunk(head.entries, room)
        if not moved:
            return None
        seq = max(self._views.get(name, (shard, Marks()))[1].seq,
                  marks.shards.get(name, 0)) + 1
        raw = {u: e.to_json() for u, e in moved.items()}
        try:
            if shard.resource_version is None:
                answer = self.api.create_quota_ledger({
                    "apiVersion": names.API_VERSION, "kind": KIND, "metadata": {"name": name},
                    "spec": {"scope": scope, "head": head.node, "seq": seq, "entries": raw}})
            else:
                answer = self.api.patch_quota_ledger(
                    name, {"spec": {"seq": seq, "entries": raw}}, shard.resource_version)
        except KubeError:
            self.forget(name)  # read it again next time
            raise
        self._remember(_named(advanced(shard, raw, answer), name), Marks(seq=seq, head=head.node))
        return self._drop_moved(head, marks, name, seq, moved)

    def _drop_moved(self, head: View, marks: Marks, name: str, seq: int,
                    moved: dict[str, Entry]) -> View:
        """The head without the entries now in shard ``name`` at move ``seq`` (those it
        still holds unchanged), recording that move; re-read on a conflict."""
        for _ in range(4):
            gone: dict[str, Any] = {u: None for u, e in moved.items()
                                    if head.entries.get(u) == e}
            mark = max(seq, marks.shards.get(name, 0))
            try:
                answer = self.api.patch_quota_ledger(
                    head.node, {"spec": {"shards": {name: mark}, "entries": gone}},
                    head.resource_version)
            except Conflict:
                head, marks = self._fetch(head.node)
                continue
            return self._remember(_named(advanced(head, gone, answer), head.node),
                                  marks_of(answer))[0]
        raise Conflict(f"QuotaLedger {head.node} kept changing", 409)

    def _target(self, head: View, marks: Marks) -> tuple[str, View, int]:
        """The shard to move to: the first with room for the whole head, else a new one."""
        need = min(size_of(head.entries), self.shard_bytes)
        for name, seq in sorted(marks.shards.items(), key=lambda ns: shard_index(ns[0])):
            shard = self.shard(name, head.node, seq)
            room = self.shard_bytes - self._size(shard)
            if room >= need:
                return name, shard, room
        taken = {shard_index(n) for n in marks.shards}
        name = shard_name(head.node, min(set(range(len(taken) + 1)) - taken))
        shard = self.shard(name, head.node, 0)  # one left by a deleted head is reused
        return name, shard, self.shard_bytes - self._size(shard)

    def _size(self, view: View) -> int:
        with self._lock:
            known = self._sizes.get(view.node)
        if known is not None and known[0] == view.resource_version:
            return known[1]
        size = size_of(view.entries)
        with self._lock:
            self._sizes[view.node] = (view.resource_version, size)
        return size


def _named(view: View, name: str) -> View:
    return View(name, view.resource_version, view.entries)


@dataclass(frozen=True, slots=True)
class Charged:
    """One bind's charge waiting for a QuotaLedger's write."""

    key: str
    entry: Entry
    charge: Charge


class QuotaGate:
    """Admits a bind's charge in every quota scope's ledger, or says why not."""

    def __init__(self, cache: ClusterCache, ledgers: QuotaLedgers, attempts: int,
                 on_conflict: Callable[[], None] = lambda: None):
        self.cache = cache
        self.ledgers = ledgers
        self.attempts = attempts
        self.on_conflict = on_conflict
        self.batches: Batches[Charged, str] = Batches()

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
        """'' when admitted in QuotaLedger ``name``, else why not: in one write with the
        other binds of this replica waiting for that ledger (``turns.Batches``)."""
        return self.batches.submit(name, Charged(key, entry, charge),
                                   lambda batch: self._admit_batch(name, scope, batch))

    def _admit_batch(self, name: str, scope: str, batch: Sequence[Charged]) -> list[str]:
        """Each charge of ``batch`` checked on the ledger's version, those that fit written
        together; a conflict checks them all again."""
        for _ in range(self.attempts):
            try:
                view, marks = self.ledgers.state(name)
                whole = self.ledgers.whole(view, marks)
                keys = {c.key for c in batch}
                with self.cache.lock:
                    whys = [self.refusal(whole, c.key, c.charge) for c in batch]
                    prune = [u for u in self.cache.quota_prunable(view) if u not in keys]
                fit = {c.key: c.entry for c, why in zip(batch, whys, strict=True) if not why}
                if fit:
                    self.ledgers.spread(self.ledgers.commit_all(view, scope, fit, prune), scope)
                if len(fit) < len(batch):  # the version remembered may be outdated: the
                    self.ledgers.forget(name)  # next bind reads it
                return whys
            except Unreadable as exc:
                self.ledgers.forget(name)
                return [f"the quota of {scope} cannot be checked for {c.entry.pod or c.key}: "
                        f"{exc}; nothing was written (fix or delete that object: "
                        "docs/tenancy.md, \"QuotaLedger shards\"); the scheduler will retry"
                        for c in batch]
            except (Conflict, AlreadyExists):
                self.on_conflict()
                self.ledgers.forget(name)
            except KubeError as exc:
                self.ledgers.forget(name)
                hint = " (is the QuotaLedger CRD applied? deploy/crds/quotaledgers.yaml)" \
                    if isinstance(exc, NotFound) else ""
                return [f"recording the quota charge of {c.key} in QuotaLedger {name} failed: "
                        f"{exc}{hint}; the scheduler will retry" for c in batch]
        return [f"the quota of {scope} kept changing under {c.key} ({self.attempts} "
                "attempts); the scheduler will retry" for c in batch]

    def refusal(self, view: View, key: str, charge: Charge) -> str:
        """Why ``charge`` of pod ``key`` does not fit, counting the cache's charges and the
        live entries of ``view`` it does not hold yet ('' when it fits; under lock)."""
        book, tenants = self.cache.catalogue.quotas, self.cache.catalogue.tenants
        with self.counting(view, (key,)):
            reason = book.check(charge) or tenants.check(book, charge, key)  # its ask, once
        return "" if reason is None else reason.message

    @contextmanager
    def counting(self, view: View, asking: Collection[str]) -> Iterator[None]:
        """For the block, the cache's quota book as the scope of ``view`` stands for the
        pods ``asking``: their own tentative charges set aside (they are what is asked),
        the live entries of ``view`` the book does not hold yet charged in (under lock)."""
        book = self.cache.catalogue.quotas
        stale = set(self.cache.quota_prunable(view))
        mine = {k: c for k in asking if (c := book.refund(k)) is not None}
        added = [u for u in view.entries if u not in asking and u not in stale and
                 book.charged(u) is None]
        try:
            for uid in added:
                book.charge(uid, charge_of_entry(view.entries[uid]))
            yield
        finally:
            for uid in added:
                book.refund(uid)
            for k, c in mine.items():
                book.charge(k, c)

    def roll_back(self, written: Iterable[str], key: str) -> None:
        for name in written:
            try:
                self.ledgers.remove(name, key)
            except KubeError as exc:  # stale once the pending grace has passed
                log.warning("removing %s from QuotaLedger %s: %s", key, name, exc)
