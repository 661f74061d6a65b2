"""The live cluster as ``gpupool inspect`` shows it, built from listed API objects.

Every object is read by the reader the rest of gpupool uses: GPUDevices by
``contract.devices``, ResourceClasses and ResourceGroups by ``contract.tenancy``,
decisions by ``contract.annotations``, v1 Nodes (allocatable CPU and memory, GPUs by
index, heartbeat freshness) by the extender's ``inventory`` and pods (CPU and memory
requests, class, group) by the extender's ``pods``; what pods hold is reserved in a core
``ClusterState`` and charged in a core ``QuotaBook``, as the extender does. Nothing
here decides fit or decodes an annotation a second way.

Two things differ from the extender's cache, on purpose:

* every decision's signature is checked (``Signatures``); a decision that is
  unsigned or whose signature does not verify, while gpupool's decision keys are
  published, is *forged*: it is shown, and not counted (nor is a decision on a pod
  that asks no gpupool GPU resource), as the extender and node agents refuse them;
* holdings are reserved while every GPU counts as healthy, and health (reported
  health, heartbeat age, isolation) is applied afterwards, so a GPU that went
  unhealthy under its pods still shows what they hold.

Objects that cannot be read become ``problems`` (one sentence each), never errors.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from gpupool.contract import annotations as records
from gpupool.contract import names, tenancy
from gpupool.contract.devices import DeviceRecord, read_device
from gpupool.core.allocation import Allocation
from gpupool.core.classes import ClassCatalog
from gpupool.core.eligibility import Catalogue
from gpupool.core.errors import GpupoolError, InvalidInput
from gpupool.core.groups import GroupCatalog
from gpupool.core.quota import Charge, QuotaBook, amount_of_allocation
from gpupool.core.state import ClusterState
from gpupool.extender.state import inventory, ledger
from gpupool.extender.state.pods import PodFacts, facts_of
from gpupool.security.signing import KeyRing, SignatureError, claims_of

VERIFIED, FORGED, UNCHECKED, LEDGER = "verified", "forged", "unchecked", "ledger"


@dataclass(frozen=True, slots=True)
class Signature:
    """How a decision's ``gpupool.io/signature`` stands: ``state`` is verified, forged
    (not counted), unchecked (the keys could not be read; counted) or ledger (not signed
    but the very entry the extender wrote for the pod in its node's GPULedger; counted)."""

    present: bool
    state: str
    key: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class Signatures:
    """The published decision keys (``ring``), or why they could not be read."""

    ring: KeyRing | None
    problem: str = ""

    def check(self, uid: str, namespace: str, name: str,
              notes: Mapping[str, str]) -> Signature:
        signature = notes.get(names.ANNOTATION_SIGNATURE)
        if self.ring is None:
            said = "signed" if signature else "not signed"
            return Signature(bool(signature), UNCHECKED,
                             message=f"{said}; not checked: {self.problem}")
        try:
            kid = self.ring.verify(claims_of(uid, namespace, name, notes), signature)
        except SignatureError as exc:
            return Signature(bool(signature), FORGED, message=str(exc))
        return Signature(True, VERIFIED, kid, f"signed by gpupool's decision key {kid}")


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPUDevice as read, and whether new slices may go to it now."""

    record: DeviceRecord
    takes_placements: bool  # the extender's rule: healthy, not isolated, heard from lately
    heartbeat_age_s: float | None  # since the last heartbeat (or creation, without one)
    stale: bool  # heard from longer ago than the extender waits


@dataclass(frozen=True, slots=True)
class Holder:
    """A pod with a readable decision, how its signature stands, and whether it counts."""

    facts: PodFacts
    allocation: Allocation
    signature: Signature
    counted: bool
    why_not: str = ""  # why it is not counted ("" when it is)

    @property
    def pod(self) -> str:
        return f"{self.facts.namespace}/{self.facts.name}"


@dataclass
class LiveCluster:
    """The state with every counted holding reserved, the catalogue charged, the facts."""

    state: ClusterState
    catalogue: Catalogue
    gpus: dict[str, Gpu] = field(default_factory=dict)  # by uuid
    holders: dict[str, Holder] = field(default_factory=dict)  # by pod uid
    groups_read: dict[str, str] = field(default_factory=dict)  # group -> problem ("" = ok)
    tenants: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    signatures: Signatures = field(default_factory=lambda: Signatures(None, "not read"))
    ledgers: dict[str, ledger.View] = field(default_factory=dict)  # by node
    _by_gpu: dict[str, list[tuple[Holder, int, int, str]]] | None = None

    def holders_on(self, uuid: str) -> list[tuple[Holder, int, int, str]]:
        """(holder, memory MiB, core %, container) of every slice of GPU ``uuid``, counted
        holders first (indexed by GPU on first use: one pass over the holders)."""
        if self._by_gpu is None:
            self._by_gpu = {}
            for h in self.holders.values():
                for s in h.allocation.slices:
                    self._by_gpu.setdefault(s.gpu_uuid, []).append(
                        (h, s.memory_mib, s.core_pct, s.container))
        return sorted(self._by_gpu.get(uuid, []),
                      key=lambda t: (not t[0].counted, t[0].pod, t[3]))


def build(nodes: Iterable[Any], devices: Iterable[Mapping[str, Any]], pods: Iterable[Any],
          classes: Iterable[Mapping[str, Any]], groups: Iterable[Mapping[str, Any]],
          signatures: Signatures, now_s: float, stale_after_s: float,
          memory_unit_mib: int, ledgers: Iterable[Mapping[str, Any]] = ()) -> LiveCluster:
    """The live cluster from listed objects (lightkube Node and Pod models, CR dicts)."""
    problems: list[str] = []
    pods = list(pods)
    records_by_node = _devices(devices, problems)
    facts = {f.name: f for f in (inventory.node_facts(n) for n in nodes)}
    for node in sorted(set(records_by_node) - set(facts)):
        problems.append(f"GPUDevices name node {node}, which is not a Node of the cluster")
    homes = _remote_homes(pods)
    built = [inventory.build_node(facts[n], records_by_node.get(n, ()), now_s, stale_after_s)
             for n in sorted(facts) if n in records_by_node or n in homes]
    state = ClusterState(built, memory_unit_mib)
    live = LiveCluster(state, Catalogue(GroupCatalog(), ClassCatalog(), QuotaBook()),
                       problems=problems, signatures=signatures)
    for recs in records_by_node.values():
        for rec in recs:
            seen = rec.heartbeat_s if rec.heartbeat_s is not None else rec.created_s
            age = None if seen is None else max(now_s - seen, 0.0)
            takes = inventory.is_fresh(rec, now_s, stale_after_s) and not rec.isolated
            live.gpus[rec.gpu.uuid] = Gpu(rec, takes, age, age is not None and age > stale_after_s)
    _read_catalogue(live, classes, groups)
    with _quiet(ledger.__name__):  # undecodable entries are left out, as the extender does
        live.ledgers = {v.node: v for v in (ledger.view_of(obj) for obj in ledgers)}
    _hold(live, list(pods))
    _apply_health(live)
    return live


def _remote_homes(pods: Iterable[Any]) -> set[str]:
    """The nodes of pods whose slices a slice server serves (``servedBy``): in the state
    even without GPUs, as the extender holds them with remote slices on."""
    out = set()
    for pod in pods:
        raw = (pod.metadata.annotations or {}).get(names.ANNOTATION_ALLOCATION, "")
        if '"servedBy"' in raw and pod.spec is not None and pod.spec.nodeName:
            out.add(pod.spec.nodeName)
    return out


def _devices(devices: Iterable[Mapping[str, Any]], problems: list[str]
             ) -> dict[str, list[DeviceRecord]]:
    by_node: dict[str, list[DeviceRecord]] = {}
    for obj in devices:
        try:
            rec = read_device(obj)
        except InvalidInput as exc:
            problems.append(f"{exc} (not shown)")
            continue
        by_node.setdefault(rec.node, []).append(rec)
    return by_node


def _read_catalogue(live: LiveCluster, classes: Iterable[Mapping[str, Any]],
                    groups: Iterable[Mapping[str, Any]]) -> None:
    for obj in classes:
        found = tenancy.class_of(obj, _name(obj))
        if isinstance(found, tenancy.Broken):
            live.problems.append(f"ResourceClass {_name(obj)} is ignored: {found.message}")
        else:
            live.catalogue.classes.put(found)
    for obj in groups:
        name = _name(obj)
        read = tenancy.group_of(obj, name)
        if isinstance(read, tenancy.Broken):
            live.groups_read[name] = read.message
            live.problems.append(f"ResourceGroup {name} is ignored: {read.message}")
            continue
        group, limit = read
        live.catalogue.groups.put(group)
        live.catalogue.quotas.set_group_limit(group.name, limit)
        live.groups_read[group.name] = ""


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("name") or "?") if isinstance(meta, Mapping) else "?"


@contextmanager
def _quiet(module: str) -> Iterator[None]:
    """The extender's readers log what they leave out; here it becomes problems."""
    logger = logging.getLogger(module)
    before = logger.disabled
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = before


def _hold(live: LiveCluster, pods: list[Any]) -> None:
    """Reserve what every live pod holds (decisions first, then CPU and memory of bound
    pods without a counted decision) and charge quota, as the extender counts them."""
    with _quiet(facts_of.__module__):
        facts = [(p, facts_of(p)) for p in pods]
    state = live.state
    for row in range(len(state.nodes)):  # reserve as if healthy (module docstring)
        for gpu in state.nodes[row].gpus:
            state.set_health(state.nodes[row].name, gpu.uuid, True)
    with state.deferred():  # thousands of holds: each touched row is refreshed once
        for pod, f in facts:
            if not f.terminal:
                _hold_decision(live, pod, f)
        for _, f in facts:
            if f.node in state.index and not f.terminal and f.uid not in state.allocations:
                _try_reserve(state, Allocation(f.uid, f.node, f.cpu_milli, f.memory_mib))


def _hold_decision(live: LiveCluster, pod: Any, f: PodFacts) -> None:
    notes = dict(pod.metadata.annotations or {})
    if not f.node or not records.has_decision(notes):
        return  # an unbound pod holds nothing yet (the extender's rule)
    try:
        alloc = records.holding(f.uid, notes, f.node)
    except InvalidInput as exc:
        live.problems.append(f"pod {f.namespace}/{f.name}: its decision cannot be read: {exc}")
        return
    if alloc is None:
        return  # marked failed, or made for another node
    signature = live.signatures.check(f.uid, f.namespace, f.name, notes)
    if signature.state == FORGED and _in_ledger(live, f, alloc, notes):
        signature = Signature(signature.present, LEDGER, message=(
            f"{signature.message}; but it is the entry the extender wrote for this pod in "
            f"GPULedger {alloc.node}, which vouches for it"))
    why = "forged decision: " + signature.message if signature.state == FORGED else ""
    if not why and not f.asks_gpu:
        why = "the pod asks no gpupool GPU resource, so its decision can hold no GPU"
    if not why and f.node not in live.state.index:
        why = f"node {f.node} has no GPUs gpupool knows"
    if not why:
        why = _try_reserve(live.state, alloc)
    live.holders[f.uid] = Holder(f, alloc, signature, not why, why)
    if why:
        live.problems.append(f"pod {f.namespace}/{f.name}: not counted: {why}")
        return
    live.tenants.add(f.namespace)
    live.catalogue.quotas.charge(f.uid, Charge(amount_of_allocation(alloc),
                                               f.namespace, f.gpu_class, f.group))


def _in_ledger(live: LiveCluster, f: PodFacts, alloc: Allocation,
               notes: Mapping[str, str]) -> bool:
    """The extender's rule (``ledger.vouches``): decisions bound before signing existed
    count when they are the very entry the extender wrote for the pod."""
    return ledger.vouches(live.ledgers.get(alloc.node), f.uid, f.namespace, f.name, notes,
                          alloc)


def _try_reserve(state: ClusterState, alloc: Allocation) -> str:
    """'' when ``alloc`` was reserved, else why not (another holder took the room)."""
    try:
        state.reserve(alloc)
    except GpupoolError as exc:
        return f"does not fit what others hold ({exc})"
    return ""


def _apply_health(live: LiveCluster) -> None:
    for gpu in live.gpus.values():
        rec = gpu.record
        if rec.node in live.state.index:
            live.state.set_health(rec.node, rec.gpu.uuid, gpu.takes_placements)
