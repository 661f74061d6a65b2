"""QuotaLedger shards: how one quota scope's entries spread over several objects and stay
exact.

The scope's ledger object (``tenant.team-a``, the *head*) is the only one a bind writes
with a compare-and-swap: it is the scope's single serialisation point. When the head
holds ``move_at`` entries or more, the bind that wrote it *moves* them to a *shard*
(``shard-<k>.<head>``) in two compare-and-swap writes, always in this order:

1. the shard gets the entries and a move number ``seq`` one above both its own and the
   one the head records for it;
2. the head drops the entries and records ``spec.shards[<shard>] = seq``.

Admission reads the head at version *v*, then every shard the head at *v* names, each at
a version whose ``seq`` is at least the one recorded (a GET when the shard remembered is
older), and checks the charge against the union of their entries (an entry in two
objects, a move caught half way, counts once: entries are keyed by pod). It then writes
the head with *v* as the precondition. Exact, because every charge enters a scope only
through a head write, and each entry that left the head before *v* was written to its
shard before it left, at a move number the head at *v* records: the shard version read
holds it unless it was pruned (the pod stopped counting) or rolled back (its bind was
refused). Nothing can enter between the read of *v* and the write at *v*. Two replicas
racing at the limit therefore still serialise on the head's resourceVersion, as with one
object; what sharding lifts is the size bound (each object stays under the API server's
object limit, whatever the scope holds) and the cost of each bind's write (the head is
small). A shard that cannot be read, or does not decode entirely, refuses the scope's
binds (``Unreadable``): a charge it hides would let a bind past the limit.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpupool.core.errors import InvalidInput
from gpupool.extender.state.ledger import Entry, View, decode_entry

PREFIX = "shard-"
_MAX_NAME = 253
MOVE_AT_ENTRIES = 256  # a head this full moves its entries to a shard
SHARD_BYTES = 1_048_576  # entries' JSON a shard holds at most (etcd stores 1.5 MiB)


class Unreadable(Exception):
    """A QuotaLedger (head or shard) that cannot be trusted to show every charge."""


@dataclass(frozen=True, slots=True)
class Marks:
    """What a QuotaLedger says besides its entries: a head's shards (name -> the move
    number they hold at least), a shard's own move number and head."""

    shards: Mapping[str, int] = field(default_factory=dict)
    seq: int = 0
    head: str = ""


def shard_name(head: str, k: int) -> str:
    """Shard ``k`` of head ``head`` (prefixed: never the name of a head)."""
    plain = f"{PREFIX}{k}.{head}"
    if len(plain) <= _MAX_NAME:
        return plain
    return f"{PREFIX}{k}.h-{hashlib.sha256(head.encode()).hexdigest()[:40]}"


def shard_index(shard: str) -> int:
    """``k`` of ``shard-<k>.<head>`` (past every index when it is not one)."""
    k = shard[len(PREFIX):].split(".", 1)[0]
    return int(k) if k.isdigit() else 1 << 30


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise Unreadable(f"{what} is {value!r}, not a move number (a whole number >= 0)")
    return value


def marks_of(obj: Mapping[str, Any]) -> Marks:
    """The marks of a QuotaLedger object; ``Unreadable`` when they are malformed."""
    name = (obj.get("metadata") or {}).get("name")
    spec = obj.get("spec") or {}
    shards = spec.get("shards") or {}
    if not isinstance(shards, Mapping):
        raise Unreadable(f"QuotaLedger {name}: spec.shards is not a map of shard names")
    return Marks({str(k): _count(v, f"QuotaLedger {name}: spec.shards[{k}]")
                  for k, v in shards.items()},
                 _count(spec.get("seq", 0), f"QuotaLedger {name}: spec.seq"),
                 str(spec.get("head") or ""))


def strict_view(obj: Mapping[str, Any], name: str, head: str) -> View:
    """A shard decoded entirely: an entry that does not decode, or a shard of another
    head, is ``Unreadable`` (a charge it hides would let a bind past the limit)."""
    spec, marks = obj.get("spec") or {}, marks_of(obj)
    if marks.head != head:
        raise Unreadable(f"QuotaLedger {name} is a shard of {marks.head or 'no head'!r}, "
                         f"not of {head}")
    raw = spec.get("entries") or {}
    if not isinstance(raw, Mapping):
        raise Unreadable(f"QuotaLedger {name}: spec.entries is not a map of pod uids")
    entries: dict[str, Entry] = {}
    for uid, value in raw.items():
        try:
            entries[str(uid)] = decode_entry(str(uid), value)
        except InvalidInput as exc:
            raise Unreadable(f"QuotaLedger {name}: {exc}") from None
    rv = str((obj.get("metadata") or {}).get("resourceVersion") or "") or None
    return View(name, rv, entries)


def union(head: View, shards: list[View]) -> View:
    """Every entry of a scope, at the head's version (the head's copy wins)."""
    entries: dict[str, Entry] = {}
    for shard in shards:
        entries.update(shard.entries)
    entries.update(head.entries)
    return View(head.node, head.resource_version, entries)


def size_of(entries: Mapping[str, Entry]) -> int:
    """Bytes of ``entries``' JSON as stored (key and value)."""
    return sum(len(u) + len(json.dumps(e.to_json())) + 6 for u, e in entries.items())


def chunk(entries: Mapping[str, Entry], room_bytes: int) -> dict[str, Entry]:
    """The oldest entries (by bind time) that fit in ``room_bytes``."""
    out: dict[str, Entry] = {}
    used = 0
    for uid, entry in sorted(entries.items(), key=lambda ue: (ue[1].bind_time, ue[0])):
        cost = size_of({uid: entry})
        if used + cost > room_bytes:
            break
        out[uid], used = entry, used + cost
    return out
