"""Healing: the GPU pods of a failed GPU or of a silent node are evicted to be placed again.

``Healer.plan`` is pure (the time is passed in) and remembers what it saw between rounds:

* a GPU whose ``GPUDevice`` has said ``Unhealthy`` for ``unhealthy_for_s`` (counted
  from the first round that saw it so) has **failed**: every pod holding a slice of it
  is evicted (cause ``gpu-unhealthy``);
* a node whose GPUDevices have all been without a heartbeat for ``silent_for_s`` (the
  node agent stopped, or the node is gone) is **silent**: every pod gpupool placed there
  is evicted (cause ``node-silent``).

Only pods whose decision counts (signed by gpupool for that pod: ``Observed.holdings``)
are healed, each once: an evicted pod's uid is never evicted again, so the controller
never loops — the pod's owner (a Deployment, a Job, ...) makes a new pod, with a new uid,
that gpupool places elsewhere (the failed GPU takes no placements). A pod annotated
``gpupool.io/healing: "off"`` is left where it is (once reported); a pod already being
deleted is skipped. At most ``per_minute`` evictions are started per minute cluster-wide;
the rest wait for later rounds. An eviction the API server refuses (HTTP 429: a
PodDisruptionBudget allows no disruption now) is tried again ``retry_s`` later, for as
long as the cause lasts.

Pods whose GPUs come from ResourceClaims (DRA) are not healed here: kube-scheduler's
device taints keep new claims off the GPU, and the claims' pods stay.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpupool.contract import names
from gpupool.contract.devices import DeviceRecord
from gpupool.controller.observed import PodHolding

ANNOTATION_HEALING = names.ANNOTATION_HEALING
"""``off`` on a pod: never evict it to heal it (pod authors may set it: the webhook's
``USER_KEYS``)."""


class Cause(StrEnum):
    GPU_UNHEALTHY = "gpu-unhealthy"
    NODE_SILENT = "node-silent"


class Outcome(StrEnum):
    EVICTED = "evicted"
    BLOCKED = "blocked"  # HTTP 429: a PodDisruptionBudget
    FAILED = "failed"  # another error: tried again later
    GONE = "gone"  # the pod was already deleted (or replaced under its name)
    OPTED_OUT = "opted-out"
    DEFERRED = "deferred"  # over the rate limit this round


@dataclass(frozen=True, slots=True)
class HealingConfig:
    enabled: bool = True
    unhealthy_for_s: float = 60.0
    silent_for_s: float = 300.0
    per_minute: int = 10
    retry_s: float = 60.0


@dataclass(frozen=True, slots=True)
class Eviction:
    """One pod to evict, and why (a sentence for its Event)."""

    uid: str
    namespace: str
    name: str
    node: str
    cause: Cause
    reason: str


@dataclass(frozen=True, slots=True)
class HealingPlan:
    evict: tuple[Eviction, ...] = ()
    opted_out: tuple[Eviction, ...] = ()  # newly seen opting out
    deferred: tuple[Eviction, ...] = ()  # over the rate limit: a later round
    next_s: float | None = None  # when a grace ends or a retry is due (to look again)


@dataclass
class _Memory:
    bad_since: dict[str, float] = field(default_factory=dict)  # GPU uuid -> first seen bad
    done: set[str] = field(default_factory=set)  # pod uids evicted (or gone)
    retry_at: dict[str, float] = field(default_factory=dict)  # pod uid -> not before
    told: set[str] = field(default_factory=set)  # pod uids reported as opting out
    sent: deque[float] = field(default_factory=deque)  # eviction times, the last minute


class Healer:
    """Plans evictions round by round and remembers their outcomes (one thread)."""

    def __init__(self, config: HealingConfig | None = None):
        self.config = config or HealingConfig()
        self._m = _Memory()

    def plan(self, devices: Iterable[DeviceRecord], holdings: Iterable[PodHolding],
             pods: Mapping[str, Mapping[str, Any]], now: float) -> HealingPlan:
        """What to evict now; ``pods``: uid -> the pod object (annotations, deletion)."""
        if not self.config.enabled:
            return HealingPlan()
        devs = list(devices)
        failed, due = self._failed_gpus(devs, now)
        silent, due_silent = self._silent_nodes(devs, now)
        wanted = self._wanted(holdings, failed, silent)
        self._m.done &= {h for h in pods}  # forget pods that are gone
        for gone in set(self._m.retry_at) - set(pods):
            del self._m.retry_at[gone]
        out: list[Eviction] = []
        opted: list[Eviction] = []
        deferred: list[Eviction] = []
        while self._m.sent and now - self._m.sent[0] >= 60.0:
            self._m.sent.popleft()
        room = self.config.per_minute - len(self._m.sent)
        for e in wanted:
            pod = pods.get(e.uid)
            if pod is None or e.uid in self._m.done or _deleting(pod) or \
                    self._m.retry_at.get(e.uid, now) > now:
                continue
            if _opted_out(pod):
                if e.uid not in self._m.told:
                    self._m.told.add(e.uid)
                    opted.append(e)
                continue
            if room <= 0:
                deferred.append(e)
                continue
            room -= 1
            out.append(e)
        retries = [t for t in self._m.retry_at.values() if t > now]
        soon = [t for t in (due, due_silent, *retries) if t is not None]
        if deferred and self._m.sent:
            soon.append(self._m.sent[0] + 60.0)
        return HealingPlan(tuple(out), tuple(opted), tuple(deferred), min(soon, default=None))

    def record(self, eviction: Eviction, outcome: Outcome, now: float) -> None:
        """What became of an eviction the plan asked for."""
        if outcome in (Outcome.EVICTED, Outcome.GONE):
            self._m.done.add(eviction.uid)
            self._m.retry_at.pop(eviction.uid, None)
        else:
            self._m.retry_at[eviction.uid] = now + self.config.retry_s
        if outcome in (Outcome.EVICTED, Outcome.BLOCKED, Outcome.FAILED):
            self._m.sent.append(now)

    # -- causes ---------------------------------------------------------------------------
    def _failed_gpus(self, devs: list[DeviceRecord], now: float
                     ) -> tuple[dict[str, str], float | None]:
        """GPU uuid -> why it failed; and when the next GPU's grace ends."""
        bad = {d.gpu.uuid: d for d in devs if not d.reported_healthy}
        for uuid in set(self._m.bad_since) - set(bad):
            del self._m.bad_since[uuid]
        failed: dict[str, str] = {}
        later: list[float] = []
        for uuid, d in bad.items():
            since = self._m.bad_since.setdefault(uuid, now)
            if _past(since, self.config.unhealthy_for_s, now, later):
                failed[uuid] = f"GPU {uuid} on node {d.node} has been unhealthy for " \
                               f"{now - since:.0f} s"
        return failed, min(later, default=None)

    def _silent_nodes(self, devs: list[DeviceRecord], now: float
                      ) -> tuple[dict[str, str], float | None]:
        """Node -> why it is silent; and when the next node would turn silent."""
        last: dict[str, float] = {}
        for d in devs:
            seen = d.heartbeat_s if d.heartbeat_s is not None else d.created_s
            if seen is not None:
                last[d.node] = max(last.get(d.node, seen), seen)
        silent: dict[str, str] = {}
        later: list[float] = []
        for node, seen in last.items():
            if _past(seen, self.config.silent_for_s, now, later):
                silent[node] = f"the node agent of {node} has not reported for " \
                               f"{now - seen:.0f} s"
        return silent, min(later, default=None)

    @staticmethod
    def _wanted(holdings: Iterable[PodHolding], failed: Mapping[str, str],
                silent: Mapping[str, str]) -> list[Eviction]:
        out = []
        for h in sorted(holdings, key=lambda h: h.pod):
            ns, _, name = h.pod.partition("/")
            node = h.allocation.node
            if node in silent:
                out.append(Eviction(h.key, ns, name, node, Cause.NODE_SILENT, silent[node]))
                continue
            hit = sorted({s.gpu_uuid for s in h.allocation.slices} & set(failed))
            if hit:
                out.append(Eviction(h.key, ns, name, node, Cause.GPU_UNHEALTHY,
                                    failed[hit[0]]))
        return out


def _past(since: float, grace_s: float, now: float, later: list[float]) -> bool:
    """Whether ``grace_s`` from ``since`` has passed; if not, when it will (into ``later``)."""
    if now >= since + grace_s:
        return True
    later.append(since + grace_s)
    return False


def _opted_out(pod: Mapping[str, Any]) -> bool:
    notes = (pod.get("metadata") or {}).get("annotations") or {}
    return str(notes.get(ANNOTATION_HEALING, "")).strip().lower() == "off"


def _deleting(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))
