"""A gang's holds charged in the QuotaLedgers, all of them or none (docs/gangs.md).

A gang's holds count in every replica's quota arithmetic once that replica's GPULedger
watch shows them, which is too late for a replica placing another gang of the same tenant
at the same moment. So before its GPU slices are held (``gangholds``), each member's hold
entry (kind ``hold``, ``expires`` at the gang's timeout) is written into the QuotaLedger
of every scope its charge falls under (``quotaledger.scopes_of``), by the compare-and-swap
binds use:

* per scope, in name order: the ledger is read afresh (a GET: a gang is placed rarely and
  its answer must not rest on an old version), the members' charges *together* are checked
  with the core's arithmetic for a gang (``core.gangquota.gang_refusal``) on the cache's
  quota book with the ledger's live entries it does not hold yet charged in
  (``QuotaGate.counting``), and all of the scope's member entries are written in one merge
  patch carrying the version checked; a conflict reads and checks again;
* a scope that refuses (or keeps changing, or cannot be written) removes what the scopes
  before it got: nothing of the gang stays charged.

The entries stop counting exactly when the holds do (``Commitments.quota_prunable``: at
``expires``, once the member is bound, or gone), and ``release`` removes them with the
holds of a gang that can no longer reach its quorum. A member's bind writes its bind entry
under the same key, replacing its hold entry, and its own hold is set aside when its
charge is checked: the member is charged once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from gpupool.core.gangquota import gang_refusal
from gpupool.extender.state.ledger import Entry
from gpupool.extender.tenancy.quotaledger import QuotaGate, charge_of_entry, scopes_of
from gpupool.extender.tenancy.quotashards import Unreadable
from gpupool.kube.errors import AlreadyExists, Conflict, KubeError

log = logging.getLogger(__name__)

Charged = dict[str, tuple[str, ...]]
"""QuotaLedger name -> the members whose hold entries it got."""
Scoped = dict[str, tuple[str, dict[str, Entry]]]
"""QuotaLedger name -> (its scope, the members' entries it is to get)."""


class GangQuota:
    """Charges a gang's holds in its QuotaLedgers, all or none (thread-safe as the gate)."""

    def __init__(self, gate: QuotaGate):
        self.gate = gate

    def scopes(self, entries: Mapping[str, Entry]) -> Scoped:
        """The members' hold ``entries`` (pod uid -> entry) by the QuotaLedger of each scope
        their charges fall under (under the cache lock)."""
        by_scope: Scoped = {}
        for uid, entry in entries.items():
            for name, scope in scopes_of(self.gate.cache, charge_of_entry(entry)).items():
                by_scope.setdefault(name, (scope, {}))[1][uid] = entry
        return by_scope

    def admit(self, gang: str, by_scope: Scoped) -> tuple[Charged, str]:
        """(the ledgers written, '' when every scope took its members' entries
        (``scopes``), else the first scope's reason; then nothing stays written)."""
        written: Charged = {}
        for name, (scope, mine) in sorted(by_scope.items()):
            why = self._admit_in(name, scope, gang, mine)
            if why:
                self.release(written)
                return {}, why
            written[name] = tuple(mine)
        return written, ""

    def _admit_in(self, name: str, scope: str, gang: str, entries: Mapping[str, Entry]) -> str:
        gate, ledgers = self.gate, self.gate.ledgers
        charges = [charge_of_entry(e) for e in entries.values()]
        for _ in range(gate.attempts):
            ledgers.forget(name)
            try:
                view, marks = ledgers.state(name)
                whole = ledgers.whole(view, marks)
                with gate.cache.lock, gate.counting(whole, entries.keys()):
                    reason = gang_refusal(gang, charges, gate.cache.catalogue)
                    prune = [u for u in gate.cache.quota_prunable(view) if u not in entries]
                if reason is not None:
                    return reason.message
                ledgers.spread(ledgers.commit_all(view, scope, entries, prune), scope)
                return ""
            except Unreadable as exc:
                return f"gang {gang}: the quota of {scope} cannot be checked: {exc}"
            except (Conflict, AlreadyExists):
                gate.on_conflict()
            except KubeError as exc:
                return f"gang {gang}: recording its quota charges in QuotaLedger {name} " \
                       f"failed: {exc}"
        return f"gang {gang}: the quota of {scope} kept changing ({gate.attempts} attempts)"

    def release(self, written: Mapping[str, Sequence[str]]) -> None:
        """Remove the members' entries that are still holds from the ledgers that got them,
        at the version read (a member that bound meanwhile keeps its bind's entry); best
        effort: they stop counting at the holds' expiry anyway."""
        ledgers = self.gate.ledgers
        for name, uids in sorted(written.items()):
            for _ in range(self.gate.attempts):
                ledgers.forget(name)
                try:
                    view = ledgers.known(name)
                    ledgers.prune(view, [u for u in uids if (e := view.entries.get(u))
                                         is not None and e.is_hold])
                    break
                except Conflict:
                    continue
                except (KubeError, Unreadable) as exc:
                    log.warning("removing gang holds from QuotaLedger %s: %s", name, exc)
                    break
