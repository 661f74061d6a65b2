"""The preempt verb: reading ``ExtenderPreemptionArgs`` from a request body without a
Python dict per victim, and whether the victims kube-scheduler proposes free enough GPU
(``fits_without``).

kube-scheduler sends, per candidate node, the victims it proposes: ``{"UID": ...}``
each (``NodeNameToMetaVictims``, node-cache capable) or whole pods
(``NodeNameToVictims``). Only their UIDs matter here, so the victims are decoded into
small structs that keep the UID and skip everything else (a whole pod costs its bytes,
not a tree of dicts): a 10 MiB body of the smallest victims takes about 85 MiB instead
of 210. The structs follow kube-scheduler's spelling of the keys (Go's field names,
``uid`` inside a pod's metadata); a body spelled otherwise (hand-written, other case) is
read by the general, case-insensitive ``protocol.parse_preemption`` when it is small
(``GENERAL_BYTES``), and refused with a sentence saying why when it is not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from gpupool.core.errors import InvalidInput
from gpupool.core.placement import Placer
from gpupool.core.request import PodRequest
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.wire import protocol

GENERAL_BYTES = 1024 * 1024


class _Meta(msgspec.Struct, gc=False):
    uid: Any = None


class _Victim(msgspec.Struct, gc=False):
    UID: Any = None  # a MetaPod
    metadata: _Meta | None = None  # a v1.Pod


class _Victims(msgspec.Struct, gc=False):
    Pods: msgspec.Raw = msgspec.Raw(b"null")  # read per node (``_uids``)
    NumPDBViolations: Any = 0


_TABLE = msgspec.json.Decoder(dict[str, _Victims])
_PODS = msgspec.json.Decoder(list[_Victim] | None)
_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
_NONE: tuple[str, ...] = ()
ENTRY_KEY = b'"NumPDBViolations":'
SMALLEST_ENTRY = len(b'"":{"Pods":[],"NumPDBViolations":0},')
TABLES = {"nodenametometavictims": True, "nodenametovictims": False}


def too_many_nodes(body: bytes | bytearray, most: int) -> str:
    """Why ``body`` is refused unread when it names more candidate nodes than ``most`` (a
    cluster of the size served has no more), else "". Counted, not decoded: Go writes
    ``"NumPDBViolations":`` in every node's entry, and nowhere else can it stand
    unescaped but as a key, so the count is at least the nodes named."""
    if len(body) < most * SMALLEST_ENTRY:
        return ""  # too short to name that many
    named = body.count(ENTRY_KEY)
    if named <= most:
        return ""
    return (f"the request names {named} candidate nodes, more than the {most} of the "
            "largest cluster this extender serves (--max-nodes)")


def read_preemption(body: bytes | bytearray) -> protocol.PreemptionArgs:
    """``PreemptionArgs`` of a preempt body; ``InvalidInput`` says what is wrong."""
    try:
        top = {k.lower(): v for k, v in _TOP.decode(body).items()}
        for key, meta in TABLES.items():
            raw = top.get(key)
            if raw is not None and bytes(raw) != b"null":
                victims = _read_table(_TABLE.decode(raw), meta)
                if victims is not None:
                    pod = protocol.decode(bytes(top["pod"]), "preempt") if "pod" in top else None
                    if not isinstance(pod, dict):
                        raise InvalidInput("ExtenderPreemptionArgs.Pod is missing or not an "
                                           "object")
                    return protocol.PreemptionArgs(pod, *victims)
                break
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError):
        pass  # not in kube-scheduler's shape: the general reader says what is wrong
    if len(body) > GENERAL_BYTES:
        raise InvalidInput("gpupool preempt: a body this large must be spelled as "
                           "kube-scheduler writes it (NodeNameToMetaVictims / "
                           "NodeNameToVictims, Pods, UID)")
    return protocol.parse_preemption(protocol.decode(body, "preempt"))


def _read_table(table: dict[str, _Victims], meta: bool
                ) -> tuple[dict[str, Sequence[str]], dict[str, int]] | None:
    """(victims' UIDs per node, PDB violations per node), or None when an entry is not
    spelled as kube-scheduler writes it. One node at a time, in Python: a large table
    never holds the interpreter in one long call, and what is kept is untracked by the
    garbage collector (structs without ``gc``, raw bytes, tuples of strings), so it adds
    no work to collections that stop every thread (the probes' included)."""
    victims: dict[str, Sequence[str]] = {}
    violations: dict[str, int] = {}
    for node, entry in table.items():
        uids = _uids(entry.Pods, meta)
        if uids is None:
            return None
        victims[node] = uids
        count = entry.NumPDBViolations
        violations[node] = count if isinstance(count, int) and not isinstance(count, bool) \
            else 0
    return victims, violations


def _uids(pods: msgspec.Raw, meta: bool) -> tuple[str, ...] | None:
    """The victims' UIDs of one node's ``Pods``, or None when not spelled as kube-scheduler
    writes them."""
    raw = bytes(pods)
    if raw == b"[]":
        return _NONE
    listed = _PODS.decode(raw)
    if listed is None:
        return None
    uids: list[Any] = [v.UID if meta else (v.metadata.uid if v.metadata else None)
                       for v in listed]
    return tuple(uids) if all(isinstance(u, str) and u for u in uids) else None


def fits_without(cache: ClusterCache, placer: Placer, request: PodRequest, node: str,
                 victims: Sequence[str]) -> bool:
    """Would ``request`` fit ``node`` once ``victims`` are gone? Under the cache lock (with
    the pod's own tentative hold set aside): the victims are released, the node checked,
    and the very same allocations held again. Victims already displaced by a gpupool
    preemption are not released: their room is promised to that preemption's pod."""
    state = cache.state
    i = state.index.get(node)
    if i is None:
        return False
    if not request.gpus:
        return True
    promised = cache.displaced()
    released = [a for a in (state.release(u) for u in victims if u not in promised and
                            u in state.allocations and state.allocations[u].node == node)
                if a is not None]
    try:
        c = cache.modes.constraints(state, request, cache.catalogue)
        return bool(placer.candidates(state, request, c, among=np.array([i], np.int64)).mask[i])
    finally:
        for alloc in released:
            state.reserve(alloc)
