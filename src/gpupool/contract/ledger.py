"""GPULedger entries, shared by their writers (the extender, the controller's remote
preemption): decoding and encoding, the merge patch of a compare-and-swap, and the fit
check every writer runs before it adds an entry. Pure: no I/O, no clock, no threads.

One cluster-scoped ``GPULedger`` object per node (name = node name) lists every
GPU slice committed on that node, keyed by pod UID::

    spec:
      node: n7
      entries:
        <pod uid>: {pod: ns/name, allocation: <the gpupool.io/allocation JSON>,
                    bindTime: <RFC 3339>, tenant: ns, class: <class or "">, group: <group or "">}
        <pod uid>: {..., kind: hold, expires: <RFC 3339>, displaces: [<victim uid>, ...]}

An entry of kind ``hold`` (absent ``kind``: a bind) is room a preemption is making for a
pending pod: the slices it will take once the pods it ``displaces`` (its victims, being
evicted) are gone. Until it ``expires`` it stands for those victims in every fit check
(``counted``): the victims' own entries stay (they still vouch for their decisions) but
count nothing while a live hold displaces them, so the ledger never holds more than the
node's GPUs, and the room goes to no one else. The pod's bind replaces it.

A writer adds its entry with a merge patch that carries the resourceVersion it checked
(``Conflict`` when another writer wrote first), and only after ``FitCheck`` showed that
the entries at that version plus the new allocation do not over-commit any GPU of the
node. See docs/design/extender.md and docs/protocol.md.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from gpupool.contract import annotations as records
from gpupool.contract import names
from gpupool.contract.devices import parse_time
from gpupool.core.allocation import Allocation, Slice
from gpupool.core.errors import InvalidInput, UnknownName
from gpupool.core.model import Gpu, Node
from gpupool.core.state import ClusterState

Warn = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


def stamp(seconds: float) -> str:
    """Epoch seconds as the RFC 3339 UTC text of a ledger entry's times."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def live_hold(entry: Entry, now: float) -> bool:
    """Whether ``entry`` is a hold that has not expired at ``now``."""
    expires = entry.expires_s
    return entry.is_hold and expires is not None and now <= expires


BIND = "bind"
HOLD = "hold"


@dataclass(frozen=True, slots=True)
class Entry:
    """One committed pod on the node: a bind, or a preemption's ``hold`` of room that
    ``expires`` and stands for the victims it ``displaces``."""

    allocation: Allocation
    pod: str
    bind_time: str
    tenant: str | None = None
    gpu_class: str | None = None
    group: str | None = None
    kind: str = BIND
    expires: str = ""
    displaces: tuple[str, ...] = ()
    _times: tuple[float | None, float | None] | None = field(default=None, init=False,
                                                             repr=False, compare=False)

    @property
    def bind_s(self) -> float | None:
        return self._parsed()[0]

    @property
    def is_hold(self) -> bool:
        return self.kind == HOLD

    @property
    def expires_s(self) -> float | None:
        return self._parsed()[1]

    def _parsed(self) -> tuple[float | None, float | None]:
        """(bind time, expiry) in epoch seconds, read once per entry: every fit check,
        prune and sweep asks each entry of a node for them."""
        times = self._times
        if times is None:
            times = (parse_time(self.bind_time),
                     parse_time(self.expires) if self.expires else None)
            object.__setattr__(self, "_times", times)
        return times

    def to_json(self) -> dict[str, Any]:
        encoded = records.encode(self.allocation, self.bind_time)
        out: dict[str, Any] = {
            "pod": self.pod, "allocation": encoded[names.ANNOTATION_ALLOCATION],
            "bindTime": self.bind_time, "tenant": self.tenant or "",
            "class": self.gpu_class or "", "group": self.group or ""}
        if self.is_hold:
            out.update(kind=HOLD, expires=self.expires, displaces=list(self.displaces))
        return out


@dataclass(frozen=True, slots=True)
class View:
    """A ledger as read at one resourceVersion (``None``: the object does not exist)."""

    node: str
    resource_version: str | None = None
    entries: Mapping[str, Entry] = field(default_factory=dict)


def decode_entry(uid: str, raw: Any) -> Entry:
    if not isinstance(raw, Mapping):
        raise InvalidInput(f"ledger entry {uid} is not an object")
    decision = records.decode(uid, {names.ANNOTATION_ALLOCATION: str(raw.get("allocation"))})
    kind = raw.get("kind") or BIND
    if kind not in (BIND, HOLD):
        raise InvalidInput(f"ledger entry {uid}: kind {kind!r} is not {BIND} or {HOLD}")
    expires, displaces = str(raw.get("expires") or ""), raw.get("displaces") or []
    if kind == HOLD and (parse_time(expires) is None or not isinstance(displaces, list)
                        or not all(isinstance(v, str) for v in displaces)):
        raise InvalidInput(f"ledger entry {uid}: a hold needs an RFC 3339 expires and a "
                           "list of displaced pod uids")
    return Entry(decision.allocation, str(raw.get("pod") or ""), str(raw.get("bindTime") or ""),
                 raw.get("tenant") or None, raw.get("class") or None, raw.get("group") or None,
                 kind, expires if kind == HOLD else "",
                 tuple(displaces) if kind == HOLD else ())


def merge_changes(view: View, entries: Mapping[str, Entry], prune: Iterable[str] = ()
                  ) -> dict[str, Any]:
    """The merge patch of a ledger's ``spec.entries`` that writes ``entries`` over ``view``
    and drops ``prune`` (uid -> raw entry, None drops it): a bind written over its pod's
    hold sets the hold's fields to null, as a merge patch would keep them."""
    changes: dict[str, Any] = {u: None for u in prune if u in view.entries and u not in entries}
    for uid, entry in entries.items():
        changes[uid] = entry.to_json()
        old = view.entries.get(uid)
        if old is not None and old.is_hold and not entry.is_hold:
            changes[uid].update(kind=None, expires=None, displaces=None)
    return changes


def counted(view: View, prune: Iterable[str] = (), replacing: Collection[str] = ()
            ) -> list[Allocation]:
    """The allocations a fit check of ``view`` counts: every entry but ``prune`` and the
    entries displaced by a hold that is neither pruned nor of a pod in ``replacing`` (a
    pod's bind replaces its own hold: its victims count again unless they are gone)."""
    dropped = set(prune)
    displaced = {v for u, e in view.entries.items()
                 if e.is_hold and u not in dropped and u not in replacing for v in e.displaces}
    return [e.allocation for u, e in view.entries.items()
            if u not in dropped and u not in displaced]


def vouches(view: View | None, uid: str, namespace: str, name: str,
            notes: Mapping[str, str], decision: Allocation) -> bool:
    """Whether ``decision`` (recorded on pod ``namespace/name``) is the very bind entry the
    extender wrote for that pod in the node's GPULedger (an object only the extender may
    write): such a decision counts as if signed. A hold is never a decision."""
    entry = view.entries.get(uid) if view is not None else None
    return entry is not None and not entry.is_hold and entry.allocation == decision and \
        entry.pod == f"{namespace}/{name}" and \
        entry.bind_time == notes.get(names.ANNOTATION_BIND_TIME) and \
        (entry.group or "") == (notes.get(names.ANNOTATION_RESOURCE_GROUP) or "")


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def view_of(obj: Mapping[str, Any], memo: dict[tuple[str, str], Entry] | None = None,
            warn: Warn = _quiet) -> View:
    """Decode a GPULedger object; undecodable entries are told ``warn`` and left out.

    ``memo`` (uid, raw entry JSON) -> Entry spares re-decoding the unchanged entries
    of a ledger that a watch delivers again and again.
    """
    meta = _mapping(obj.get("metadata"))
    spec = _mapping(obj.get("spec"))
    raw = spec.get("entries") or {}
    entries: dict[str, Entry] = {}
    for uid, value in (raw.items() if isinstance(raw, Mapping) else ()):
        key = (str(uid), str(value.get("allocation")) + str(value.get("bindTime")) +
               str(value.get("kind") or "") + str(value.get("expires") or "") +
               str(value.get("displaces") or "") if isinstance(value, Mapping) else "")
        known = memo.get(key) if memo is not None else None
        if known is not None:
            entries[key[0]] = known
            continue
        try:
            entries[key[0]] = decode_entry(key[0], value)
        except InvalidInput as exc:
            warn(f"GPULedger {meta.get('name')}: {exc}")
            continue
        if memo is not None:
            memo[key] = entries[key[0]]
    node = str(spec.get("node") or meta.get("name") or "")
    return View(node, str(meta.get("resourceVersion") or "") or None, entries)


def advanced(view: View, changes: Mapping[str, Any], written: Mapping[str, Any],
             warn: Warn = _quiet) -> View:
    """The ledger after a compare-and-swap from ``view`` applied ``changes`` (uid -> raw
    entry, None drops it) and the API answered ``written``.

    The precondition makes ``written``'s entries exactly ``view``'s with ``changes``
    merged, so only the changed entries are decoded — not every entry of a busy node.
    An answer that does not have the expected entries is decoded in full.
    """
    entries = dict(view.entries)
    for uid, raw in changes.items():
        entries.pop(uid, None)
        if raw is not None:
            try:
                entries[uid] = decode_entry(uid, raw)
            except InvalidInput:
                return view_of(written, warn=warn)
    meta = written.get("metadata") or {}
    raw_entries = (written.get("spec") or {}).get("entries")
    if not isinstance(raw_entries, Mapping) or raw_entries.keys() != entries.keys() or \
            any(_pruned(raw, raw_entries.get(uid)) for uid, raw in changes.items()):
        return view_of(written, warn=warn)
    return View(view.node, str(meta.get("resourceVersion") or "") or None, entries)


def _pruned(sent: Any, stored: Any) -> bool:
    """Whether the API server dropped fields of an entry it was sent (a CRD schema older
    than the fields: a hold would have become a bind)."""
    return isinstance(sent, Mapping) and isinstance(stored, Mapping) and any(
        v is not None and k not in stored for k, v in sent.items())


def gpu_only(alloc: Allocation, node: Node) -> Allocation:
    """``alloc`` without CPU and memory, GPU positions looked up by uuid on ``node``."""
    pos = {g.uuid: p for p, g in enumerate(node.gpus)}
    slices = []
    for s in alloc.slices:
        if s.gpu_uuid not in pos:
            raise UnknownName(f"{alloc.key}: GPU {s.gpu_uuid} is not on node {node.name}")
        slices.append(replace(s, gpu_position=pos[s.gpu_uuid]) if pos[s.gpu_uuid] !=
                      s.gpu_position else s)
    return Allocation(alloc.key, alloc.node, 0, 0, tuple(slices), alloc.exclusive)


class FitCheck:
    """Whether a ledger's entries plus a new one fit a node's GPUs (``check``).

    The check replays on one-node states kept per GPU layout (each GPU's memory, in
    order: all that the check reads of a node), the ``SCRATCH_LAYOUTS`` most recently
    used; a node's slices are checked there position for position, under the
    scratch node's GPU names, and given back after. Building a ``ClusterState`` for
    every check had been half its cost (70-110 µs of 180-210 for a dozen entries).
    Not thread-safe (the kept states are shared): a caller with threads takes turns.
    """

    def __init__(self) -> None:
        self._states: OrderedDict[tuple[tuple[int, ...], int], ClusterState] = OrderedDict()

    def check(self, node: Node, held: Iterable[Allocation], new: Allocation,
              memory_unit_mib: int) -> None:
        """Raise ``OverCommit`` unless ``held`` plus ``new`` fit the GPUs of ``node``.

        Health is ignored here (a GPU that turned unhealthy keeps its holders);
        entries naming a GPU the node no longer has are skipped, a new allocation
        naming one raises ``UnknownName``. Every slice is reserved at once, as one
        allocation: the state adds up the slices of each GPU before it compares them
        with the room, so the whole fits exactly when reserving the entries one after
        another would (and costs one reservation, not one per entry).
        """
        positions = {g.uuid: p for p, g in enumerate(node.gpus)}
        slices: list[Slice] = []
        for alloc in held:
            if alloc.key != new.key:
                slices += _renamed(alloc, positions) or ()  # a GPU the node lost: skipped
        mine = _renamed(new, positions)
        if mine is None:
            raise UnknownName(f"{new.key}: a GPU of {new.describe()} is not on node "
                              f"{node.name}")
        together = Allocation(new.key, "ledger-check", 0, 0, (*slices, *mine))
        state = self._state(tuple(g.memory_mib for g in node.gpus), memory_unit_mib)
        with state.deferred():  # the row's derived values: refreshed once, not twice
            state.reserve(together)  # OverCommit: nothing was taken
            state.release(together.key)

    def _state(self, layout: tuple[int, ...], memory_unit_mib: int) -> ClusterState:
        key = (layout, memory_unit_mib)
        state = self._states.get(key)
        if state is None:
            node = Node("ledger-check", 0, 0, tuple(Gpu(f"gpu-{j}", j, "any", mib)
                                                   for j, mib in enumerate(layout)))
            state = self._states[key] = ClusterState([node], memory_unit_mib)
            while len(self._states) > SCRATCH_LAYOUTS:
                self._states.popitem(last=False)
        self._states.move_to_end(key)
        return state


def _renamed(alloc: Allocation, positions: Mapping[str, int]) -> list[Slice] | None:
    """``alloc``'s slices under the scratch node's GPU names (None: a GPU not there)."""
    out = []
    for s in alloc.slices:
        p = positions.get(s.gpu_uuid)
        if p is None:
            return None
        out.append(Slice(f"gpu-{p}", p, s.memory_mib, s.core_pct))
    return out


SCRATCH_LAYOUTS = 16
