"""The kube-scheduler extender wire format (``k8s.io/kube-scheduler/extender/v1``).

The Go types have no json tags, so the scheduler sends capitalised keys
(``Pod``, ``Nodes``, ``NodeNames``...). Top-level keys are read
case-insensitively, as Go's decoder does; answers use the capitalised names.
Anything malformed raises ``InvalidInput``; the app turns that into HTTP 200
with ``Error`` filled. Every text meant for the user (``Error``, the reasons of
``FailedNodes``) is rendered with ``reasons.for_scheduler``: kube-scheduler formats it as
a Go format string, where a ``%`` sign would be read as a verb.

Filter and prioritize bodies are read from bytes without decoding the node names:
the top-level object is decoded to raw values (``msgspec.Raw``), the pod is decoded,
and ``NodeNames`` stays the JSON array it came in as (``nodenames`` matches it to
state rows). Answers are rendered to bytes; ``parse_args`` and the dict answers
serve callers that hold decoded JSON.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from operator import itemgetter
from typing import Any, TypeVar

import msgspec

from gpupool.core.errors import InvalidInput
from gpupool.core.reasons import for_scheduler
from gpupool.extender.wire.nodenames import MAX_NODES, NOT_A_LIST, checked_names

T = TypeVar("T")
_RAW_OBJECT = msgspec.json.Decoder(dict[str, msgspec.Raw])


def _folded(body: Any, what: str) -> dict[str, Any]:
    if not isinstance(body, Mapping):
        raise InvalidInput(f"the {what} body must be a JSON object, got {type(body).__name__}")
    return {str(k).lower(): v for k, v in body.items()}


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """Filter / prioritize input: the pod, and the node names as a JSON array (or whole
    node objects: ``nodes``, and ``names_json`` is empty). ``names`` holds the names
    already decoded where they were (a NodeList's, a decoded body's), so they are looked
    up as they are rather than parsed again from ``names_json``."""

    pod: Mapping[str, Any]
    names_json: bytes
    nodes: list[Any] | None  # the NodeList items when nodeCacheCapable is false (raw JSON
    names: list[str] | None = None  # values when read from bytes: echoed, never decoded)
    pod_json: bytes = b""  # the pod as sent, when read from bytes

    @property
    def cache_capable(self) -> bool:
        return self.nodes is None


def parse_args(body: Any) -> ExtenderArgs:
    """``ExtenderArgs`` from decoded JSON."""
    args = _folded(body, "ExtenderArgs")
    names = args.get("nodenames")
    if names is not None:
        checked = checked_names(names)
        return ExtenderArgs(_pod(args.get("pod")), msgspec.json.encode(checked), None, checked)
    return _with_nodes(_pod(args.get("pod")), args.get("nodes"))


def read_args(body: bytes | bytearray, what: str) -> ExtenderArgs:
    """``ExtenderArgs`` from a request body, ``NodeNames`` left undecoded."""
    try:
        raw = _RAW_OBJECT.decode(body)
    except msgspec.ValidationError:  # valid JSON, not an object: say what it is
        return parse_args(decode(body, what))
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"gpupool {what}: the request is not valid JSON ({exc})") from None
    args = {k.lower(): v for k, v in raw.items()}
    pod_raw = args.get("pod")
    pod_json = bytes(pod_raw) if pod_raw is not None else b""
    pod = _pod(decode(pod_json, what) if pod_raw is not None else None)
    names = args.get("nodenames")
    if names is not None and bytes(names) != b"null":
        names_json = bytes(names)
        if names_json[:1] != b"[":
            raise InvalidInput(NOT_A_LIST)
        return ExtenderArgs(pod, names_json, None, pod_json=pod_json)
    nodes = args.get("nodes")
    if nodes is None or bytes(nodes) == b"null":
        raise InvalidInput("ExtenderArgs has neither NodeNames nor Nodes")
    items = _raw_items(bytes(nodes), what)
    if items is None:  # not the shape kube-scheduler writes: read it as any JSON
        return replace(_with_nodes(pod, decode(bytes(nodes), what)), pod_json=pod_json)
    return ExtenderArgs(pod, b"", items, [_raw_node_name(n) for n in items], pod_json)


class _Meta(msgspec.Struct):
    name: Any = None


class _Named(msgspec.Struct):
    metadata: _Meta | None = None


class _RawList(msgspec.Struct):
    items: list[msgspec.Raw] | None = None


_RAW_LIST = msgspec.json.Decoder(_RawList)
_NAMED = msgspec.json.Decoder(_Named)


def _raw_items(node_list: bytes, what: str) -> list[msgspec.Raw] | None:
    """The items of a NodeList as raw JSON values (a node's JSON is only echoed back, so
    it is never decoded into Python objects: a NodeList of thousands of nodes costs its
    bytes, not a hundred times them); None when the list is not spelled as Go writes it."""
    try:
        items = _RAW_LIST.decode(node_list).items
    except msgspec.ValidationError:
        return None
    except msgspec.DecodeError as exc:
        raise InvalidInput(f"gpupool {what}: the request is not valid JSON ({exc})") from None
    if items is None or len(items) > MAX_NODES:
        return None
    return items


def _raw_node_name(node: msgspec.Raw) -> str:
    try:
        meta = _NAMED.decode(node).metadata
    except (msgspec.ValidationError, msgspec.DecodeError):
        meta = None
    name = meta.name if meta is not None else None
    if not isinstance(name, str) or not name:
        raise InvalidInput("a node in ExtenderArgs.Nodes has no metadata.name")
    return name


def _pod(pod: Any) -> Mapping[str, Any]:
    if not isinstance(pod, Mapping):
        raise InvalidInput("ExtenderArgs.Pod is missing or not an object")
    return pod


def _with_nodes(pod: Mapping[str, Any], node_list: Any) -> ExtenderArgs:
    if node_list is None:
        raise InvalidInput("ExtenderArgs has neither NodeNames nor Nodes")
    items = _folded(node_list, "ExtenderArgs.Nodes").get("items") or []
    if not isinstance(items, list) or len(items) > MAX_NODES:
        raise InvalidInput("ExtenderArgs.Nodes.items must be a list of nodes")
    return ExtenderArgs(pod, b"", items, [_node_name(n) for n in items])


def _node_name(node: Any) -> str:
    meta = node.get("metadata") if isinstance(node, Mapping) else None
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        raise InvalidInput("a node in ExtenderArgs.Nodes has no metadata.name")
    return name


@dataclass(frozen=True, slots=True)
class BindingArgs:
    name: str
    namespace: str
    uid: str
    node: str


@dataclass(frozen=True, slots=True)
class PreemptionArgs:
    """``ExtenderPreemptionArgs``: the pod and, per node, the UIDs of the victims the
    scheduler proposes (from ``NodeNameToMetaVictims`` or ``NodeNameToVictims``)."""

    pod: Mapping[str, Any]
    victims: Mapping[str, Sequence[str]]
    pdb_violations: dict[str, int]


def parse_preemption(body: Any) -> PreemptionArgs:
    args = _folded(body, "ExtenderPreemptionArgs")
    pod = args.get("pod")
    if not isinstance(pod, Mapping):
        raise InvalidInput("ExtenderPreemptionArgs.Pod is missing or not an object")
    meta = args.get("nodenametometavictims")
    table = meta if meta is not None else args.get("nodenametovictims")
    if not isinstance(table, Mapping):
        raise InvalidInput("ExtenderPreemptionArgs has no NodeNameToMetaVictims / "
                           "NodeNameToVictims map")
    victims: dict[str, Sequence[str]] = {}
    violations: dict[str, int] = {}
    for node, raw in table.items():
        entry = _folded(raw, f"the victims of node {node}")
        pods = entry.get("pods") or []
        if not isinstance(node, str) or not isinstance(pods, list):
            raise InvalidInput(f"the victims of node {node} must be a list of pods")
        victims[node] = tuple(_victim_uid(p, meta is not None) for p in pods)
        count = entry.get("numpdbviolations") or 0
        violations[node] = count if isinstance(count, int) else 0
    return PreemptionArgs(pod, victims, violations)


def _victim_uid(pod: Any, meta: bool) -> str:
    obj = _folded(pod, "a victim")
    uid = obj.get("uid") if meta else (obj.get("metadata") or {}).get("uid")
    if not isinstance(uid, str) or not uid:
        raise InvalidInput("a victim pod has no UID")
    return uid


def preemption_result(victims: Mapping[str, Sequence[str]], violations: Mapping[str, int]
                      ) -> dict[str, Any]:
    return {"NodeNameToMetaVictims": {
        node: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": violations.get(node, 0)}
        for node, uids in victims.items()}}


_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*",
                        re.ASCII)
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", re.ASCII)
_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*", re.ASCII)
_BINDING_FIELDS = (  # (folded key, name in the wire format, pattern, most characters, what)
    ("podname", "PodName", _SUBDOMAIN, 253, "a pod name (a DNS subdomain)"),
    ("podnamespace", "PodNamespace", _LABEL, 63, "a namespace name (a DNS label)"),
    ("poduid", "PodUID", _UID, 128, "a pod UID"),
    ("node", "Node", _SUBDOMAIN, 253, "a node name (a DNS subdomain)"),
)


def parse_binding(body: Any) -> BindingArgs:
    """``ExtenderBindingArgs``; every field must be what the API server could hold (a pod
    name, a namespace, a UID, a node name), so nothing odd reaches a URL or a log."""
    args = _folded(body, "ExtenderBindingArgs")
    values = []
    for key, wire, pattern, most, what in _BINDING_FIELDS:
        value = args.get(key)
        if value is None or value == "":
            raise InvalidInput(f"ExtenderBindingArgs.{wire} is missing or empty")
        if not isinstance(value, str) or len(value) > most or not pattern.fullmatch(value):
            raise InvalidInput(f"ExtenderBindingArgs.{wire} {_shown(value)} is not {what}")
        values.append(value)
    name, ns, uid, node = values
    return BindingArgs(name, ns, uid, node)


def _shown(value: Any) -> str:
    """A value for an error message: its repr, cut to 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


NO_NODES = b"{}"


def filter_answer(args: ExtenderArgs, names_json: bytes, passing: Iterable[int] | None,
                  failed: bytes = NO_NODES, unresolvable: bytes = NO_NODES) -> bytes:
    """``ExtenderFilterResult`` in the shape the scheduler reads for this configuration:
    ``NodeNames`` (``names_json``: only names it sent) when node-cache capable, else
    ``Nodes`` (the sent node objects at positions ``passing``; None: all of them).
    ``failed`` and ``unresolvable`` are rendered JSON objects of node name -> reason."""
    if args.nodes is None:
        nodes = b'{"Nodes":null,"NodeNames":' + names_json
    else:
        items = args.nodes if passing is None else _pick(args.nodes, list(passing))
        nodes = b'{"Nodes":' + msgspec.json.encode(
            {"metadata": {}, "items": items}) + b',"NodeNames":null'
    return b"".join((nodes, b',"FailedNodes":', failed, b',"FailedAndUnresolvableNodes":',
                     unresolvable, b',"Error":""}'))


def _pick(items: Sequence[T], positions: Sequence[int]) -> list[T]:
    if len(positions) == len(items):
        return list(items)
    if len(positions) == 1:
        return [items[positions[0]]]
    return list(itemgetter(*positions)(items)) if positions else []


def filter_error(message: str) -> dict[str, Any]:
    return {"Nodes": None, "NodeNames": None, "FailedNodes": {},
            "FailedAndUnresolvableNodes": {}, "Error": for_scheduler(message)}


@dataclass(frozen=True, slots=True)
class Priorities:
    """A ``HostPriorityList`` already rendered to JSON (thousands of hosts per call)."""

    json: bytes

    def items(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = msgspec.json.decode(self.json)
        return result


NO_PRIORITIES = b"[]"


def decode(body: bytes | bytearray, what: str) -> Any:
    """Decoded JSON of a request body, or ``InvalidInput`` saying why not."""
    try:
        return msgspec.json.decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"gpupool {what}: the request is not valid JSON ({exc})") from None
    except RecursionError:  # the HTTP face refuses deeper bodies before: a lower limit
        raise InvalidInput(f"gpupool {what}: the request is JSON nested too deeply") from None


def encode(result: Any) -> bytes:
    if isinstance(result, Priorities):
        return result.json
    return msgspec.json.encode(result)


def binding_result(error: str = "") -> dict[str, str]:
    return {"Error": for_scheduler(error)}
