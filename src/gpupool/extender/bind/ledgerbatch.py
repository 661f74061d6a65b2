"""The GPULedger writes of this replica's binds, one write per node at a time, carrying
every bind that waited for it (``state.turns.Batches``).

A bind decides under the cache lock and holds its allocation there, so binds onto one
node decide around each other; their entries then go to the node's ledger together, in
one compare-and-swap, checked together against the ledger as the cache holds it:
``FitCheck`` on the entries at that version, less those the write prunes and those the
new entries displace (a gang's holds made by preemption), plus every new entry. When the
write is lost (another replica wrote first: ``Conflict``; or the entries do not fit:
``OverCommit``) every bind of the batch gets the same error and decides again; the ledger
is read again once, by the writer, unless the cache already holds a newer version.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpupool.core.errors import OverCommit, UnknownName
from gpupool.core.model import Node
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.state.ledger import Entry, FitCheck, Ledgers, View, counted
from gpupool.extender.state.turns import Batches
from gpupool.kube.errors import Conflict, KubeError


@dataclass(frozen=True, slots=True)
class Pending:
    """One bind's entry waiting for its node's write; ``node``: the layout it was decided
    on (the fit check's)."""

    key: str
    entry: Entry
    node: Node


@dataclass(frozen=True, slots=True)
class Written:
    """What the write carrying a bind's entry gave: the ledger after it, or the error."""

    view: View | None
    error: OverCommit | KubeError | None = None

    def outcome(self) -> View:
        """The ledger written; raises a copy of the error (each bind its own)."""
        error = self.error
        if isinstance(error, KubeError):
            raise type(error)(str(error), error.code, error.reason)
        if error is not None:
            raise OverCommit(str(error))
        assert self.view is not None
        return self.view


class LedgerBatches:
    """``commit`` adds a bind's entry to its node's ledger, in a write shared with the
    binds that wait for the same node (thread-safe)."""

    def __init__(self, cache: ClusterCache, ledgers: Ledgers, fits: FitCheck,
                 read_again: Callable[[View], None]):
        self.cache = cache
        self.ledgers = ledgers
        self.fits = fits
        self.read_again = read_again  # after a lost write: take in a fresh copy
        self.batches: Batches[Pending, Written] = Batches()

    def commit(self, ledger: str, node: Node, key: str, entry: Entry,
               on_turn: Callable[[], None] = lambda: None) -> View:
        """The ledger of node ``ledger`` with ``entry`` written under ``key``; raises
        ``Conflict`` or ``OverCommit`` when the write was lost (decide again), another
        ``KubeError`` when it failed."""
        return self.batches.submit(ledger, Pending(key, entry, node),
                                   lambda batch: self._write(ledger, batch),
                                   on_turn).outcome()

    def commit_together(self, ledger: str, node: Node, entries: Mapping[str, Entry]) -> View:
        """The ledger of node ``ledger`` with all of ``entries`` (pod uid -> entry) written
        in one write of their own, in the node's turn (a gang's holds on one node); raises
        as ``commit``."""
        with self.batches.turns.of(ledger):
            batch = [Pending(key, entry, node) for key, entry in entries.items()]
            return self._write(ledger, batch)[0].outcome()

    def _write(self, ledger: str, batch: Sequence[Pending]) -> list[Written]:
        keys = {p.key for p in batch}
        with self.cache.lock:
            view = self.cache.ledgers.get(ledger) or View(ledger)
            prune = [u for u in self.cache.prunable(view) if u not in keys]
        allocs = [p.entry.allocation for p in batch]
        try:
            gone = keys | {v for p in batch for v in p.entry.displaces}  # a gang's holds
            held = [a for a in counted(view, prune, replacing=keys) if a.key not in gone]
            self.fits.check(batch[-1].node, [*held, *allocs[:-1]], allocs[-1],
                            self.cache.state.memory_unit_mib)
            written = self.ledgers.commit_all(view, {p.key: p.entry for p in batch}, prune)
        except (OverCommit, UnknownName, Conflict) as exc:
            self.read_again(view)
            lost = exc if isinstance(exc, Conflict) else OverCommit(str(exc))
            return [Written(None, lost)] * len(batch)
        except KubeError as exc:
            return [Written(None, exc)] * len(batch)
        self.cache.ledger_update(written)
        return [Written(written)] * len(batch)
