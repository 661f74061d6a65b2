"""Gangs as the cache knows them: each gang's terms and its member pods (docs/gangs.md).

A gang is named by its members (``contract.gangs``): a PodGroup of their namespace
(``spec.schedulingGroup``), or the label ``gpupool.io/gang``. Its terms — the quorum and
where the members must be — come from the PodGroup object (its informer) or from what
the labelled members say in their annotations (they must agree). A PodGroup with the
``basic`` policy makes no gang; a pod naming a PodGroup that does not exist waits, as
kube-scheduler keeps it waiting.

``GangBook`` only keeps the records, from the pod and PodGroup informers; who is pending,
bound or held is the cache's (``ClusterCache``, under its lock).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from gpupool.contract.gangs import INVALID, GangRef, GangTerms, pod_group_terms
from gpupool.contract.tenancy import Broken
from gpupool.extender.state.pods import PodFacts

log = logging.getLogger(__name__)


class GangBook:
    """PodGroups' terms, and the members of every gang by key (not thread-safe: the
    cache's lock)."""

    def __init__(self) -> None:
        self.groups: dict[str, GangTerms | None] = {}  # PodGroup key -> terms (None: basic)
        self.broken: dict[str, str] = {}  # PodGroup key -> why it cannot be used
        self.members: dict[str, dict[str, GangTerms | Broken | None]] = {}  # key -> uid ->
        # what the member says (labelled gangs; None for a PodGroup's)
        self.gang_of: dict[str, GangRef] = {}  # pod uid -> its gang

    # -- pods ----------------------------------------------------------------------------------
    def pod(self, f: PodFacts) -> None:
        """Take in a pod as its informer shows it (a pod's gang never changes: the
        PodGroup link is immutable; a label edit moves it)."""
        if f.terminal or f.gang is None:
            self.gone(f.uid)
            return
        old = self.gang_of.get(f.uid)
        if old is not None and old != f.gang:
            self.gone(f.uid)
        self.gang_of[f.uid] = f.gang
        self.members.setdefault(f.gang.key, {})[f.uid] = f.gang_terms

    def gone(self, uid: str) -> None:
        ref = self.gang_of.pop(uid, None)
        if ref is None:
            return
        members = self.members.get(ref.key, {})
        members.pop(uid, None)
        if not members:
            self.members.pop(ref.key, None)

    # -- PodGroups -----------------------------------------------------------------------------
    def sync_groups(self, objs: Iterable[Mapping[str, Any]]) -> None:
        self.groups.clear()
        self.broken.clear()
        for obj in objs:
            self.group_event("ADDED", obj)

    def group_event(self, kind: str, obj: Mapping[str, Any]) -> GangRef | None:
        """Take in a PodGroup event; the gang it names (None: unreadable)."""
        read = pod_group_terms(obj)
        if isinstance(read, Broken):
            log.warning("%s", read.message)
            return None
        ref, terms = read
        self.broken.pop(ref.key, None)
        self.groups.pop(ref.key, None)
        if kind == "DELETED":
            return ref
        if isinstance(terms, Broken):
            log.warning("%s", terms.message)
            self.broken[ref.key] = terms.message
        else:
            self.groups[ref.key] = terms
        return ref

    # -- reading -------------------------------------------------------------------------------
    def terms(self, ref: GangRef) -> GangTerms | Broken | None:
        """The gang's terms; None: not a gang (a PodGroup of the basic policy); ``Broken``:
        why its members wait (no such PodGroup yet, labelled members that disagree)."""
        if ref.native:
            if ref.key in self.broken:
                return Broken(INVALID, self.broken[ref.key])
            if ref.key not in self.groups:
                return Broken("GangUnknown", f"{ref.key} does not exist (yet): its pods wait "
                                             "for it")
            return self.groups[ref.key]
        said = {t for t in self.members.get(ref.key, {}).values() if t is not None}
        broken = [t for t in said if isinstance(t, Broken)]
        if broken:
            return broken[0]
        if len(said) > 1:
            counts = sorted(t.min_count for t in said if isinstance(t, GangTerms))
            return Broken(INVALID, f"{ref.key}: its members disagree on what they ask "
                                   f"(min counts {', '.join(map(str, counts))}, or where)")
        return next(iter(said), None)

    def member_uids(self, ref: GangRef) -> list[str]:
        """The gang's members the pod informer shows, in uid order."""
        return sorted(self.members.get(ref.key, ()))
