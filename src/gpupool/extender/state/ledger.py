"""The per-node GPU ledger: the compare-and-swap record that keeps replicas honest.

The object's format, what a hold is, the entries' decoding and the fit check:
``gpupool.contract.ledger`` (the controller writes holds too). This module reads and
writes the objects: an extender adds its pod's entry with a merge patch that carries the
resourceVersion it checked (``Conflict`` when another replica wrote first), and only
after ``FitCheck`` showed that the entries at that version plus the new allocation do
not over-commit any GPU of the node. See docs/design/extender.md.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from gpupool.contract import ledger as entries_of
from gpupool.contract import names
from gpupool.contract.ledger import (
    BIND,
    HOLD,
    SCRATCH_LAYOUTS,
    Entry,
    View,
    counted,
    decode_entry,
    gpu_only,
    merge_changes,
    vouches,
)
from gpupool.core.allocation import Allocation
from gpupool.core.model import Node
from gpupool.kube.api import KubeApi
from gpupool.kube.errors import NotFound

__all__ = ["BIND", "HOLD", "SCRATCH_LAYOUTS", "Entry", "FitCheck", "Ledgers", "View",
           "advanced", "counted", "decode_entry", "gpu_only", "merge_changes", "view_of",
           "vouches"]

log = logging.getLogger(__name__)


def _warn(message: str) -> None:
    log.warning("%s", message)


def view_of(obj: Mapping[str, Any], memo: dict[tuple[str, str], Entry] | None = None) -> View:
    """``gpupool.contract.ledger.view_of``, undecodable entries logged."""
    return entries_of.view_of(obj, memo, _warn)


def advanced(view: View, changes: Mapping[str, Any], written: Mapping[str, Any]) -> View:
    """``gpupool.contract.ledger.advanced``, undecodable entries logged."""
    return entries_of.advanced(view, changes, written, _warn)


class FitCheck(entries_of.FitCheck):
    """``gpupool.contract.ledger.FitCheck``, thread-safe: bind threads take turns on the
    kept states."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

    def check(self, node: Node, held: Iterable[Allocation], new: Allocation,
              memory_unit_mib: int) -> None:
        with self._lock:
            super().check(node, held, new, memory_unit_mib)


class Ledgers:
    """Reads and compare-and-swap writes of GPULedger objects."""

    def __init__(self, api: KubeApi):
        self.api = api

    def fetch(self, node: str) -> View:
        try:
            return view_of(self.api.get_ledger(node))
        except NotFound:
            return View(node)

    def commit(self, view: View, uid: str, entry: Entry, prune: Iterable[str] = ()) -> View:
        """Add ``entry`` (and drop ``prune``) if the ledger is still at ``view``'s version.

        Raises ``Conflict`` (or ``AlreadyExists``) when it moved on.
        """
        return self.commit_all(view, {uid: entry}, prune)

    def commit_all(self, view: View, entries: Mapping[str, Entry], prune: Iterable[str] = ()
                   ) -> View:
        """``commit`` of several pods' entries in one write."""
        changes = merge_changes(view, entries, prune)
        if view.resource_version is None:
            obj = {"apiVersion": names.API_VERSION, "kind": "GPULedger",
                   "metadata": {"name": view.node},
                   "spec": {"node": view.node, "entries": {u: changes[u] for u in entries}}}
            return advanced(View(view.node), changes, self.api.create_ledger(obj))
        patch = {"spec": {"entries": changes}}
        return advanced(view, changes, self.api.patch_ledger(view.node, patch,
                                                             view.resource_version))

    def prune(self, view: View, uids: Iterable[str]) -> View:
        """Drop ``uids`` if the ledger is still at ``view``'s version (``Conflict`` when it
        moved on: the next reconciliation looks again)."""
        changes: dict[str, Any] = {u: None for u in uids if u in view.entries}
        if not changes or view.resource_version is None:
            return view
        return advanced(view, changes, self.api.patch_ledger(
            view.node, {"spec": {"entries": changes}}, view.resource_version))

    def remove(self, node: str, uid: str) -> None:
        """Drop ``uid``'s entry (no precondition: the key is the pod's own)."""
        try:
            self.api.patch_ledger(node, {"spec": {"entries": {uid: None}}}, None)
        except NotFound:
            return
