"""MIG on demand, the controller's part: which GPU to repartition for the pods waiting.

Off unless ``gpupool controller --mig-on-demand``. Each round, ``plan_round`` reads:

* the pending pods that ask MIG devices (``mig.gpupool.io/<profile>``; no node yet, not
  being deleted), oldest first;
* the cluster as the controller sees it (``figures.cluster_state``: published GPUs and
  MIG devices, every counted decision reserved, the nodes' labels);
* the tenancy the extender enforces (``Observed.tenancy``): ResourceClasses,
  ResourceGroups and their quotas, TenantQuotas, GPUPermissions, read by the same readers
  and charged with what the counted decisions hold;
* what the node agents were already asked (a GPUDevice's ``gpupool.io/mig-layout`` that
  its ``status.mig`` does not show made, refused or failed yet): such a GPU is left
  alone until its agent answers.

The choice is the core's (``core.repartition_waiting.serve``): each pod is judged as the
extender will judge it (``eligibility.constraints_for``), with the MIG devices it asks
counted against its quota; a pod that would be refused is skipped, only GPUs whose new
device the pod may use are offered to ``core.repartition.plan`` (grow a GPU beside its
held devices, or rebuild an idle one, whichever strands the fewest compute slices for the
profiles the pending and running MIG pods ask), and each pod planned for is held on its
new devices and charged, so that the next pods see both. Every changed GPU gets one ask
per round. The controller does not watch node CPU or memory, so a pod's CPU and memory do
not narrow the choice (kube-scheduler's filters still apply when the pod is placed).

Until the tenancy is listed (``Observed.tenancy`` None) nothing is planned: the extender,
too, places no pod while a confined tenant's permissions are unknown.

``MigPlanner`` writes each ask as the annotations ``gpupool.io/mig-layout`` and
``gpupool.io/mig-layout-reason`` on the GPU's GPUDevice; the node agent makes the layout
or says why not (``nodeagent.mig``). A skipped pod is logged, counted (``skipped``, by the
refusing check) and told once, by an Event ``GpupoolMigRepartitionSkipped`` about it.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from gpupool.contract import mig as contract
from gpupool.contract.podspec_request import pod_request
from gpupool.controller import podwrites
from gpupool.controller.catalogue import catalogue_of
from gpupool.controller.figures import cluster_state
from gpupool.controller.observed import Observed
from gpupool.core import mig
from gpupool.core.errors import GpupoolError
from gpupool.core.repartition_waiting import serve
from gpupool.core.request import PodRequest, merged_demand
from gpupool.kube.errors import KubeError

log = logging.getLogger(__name__)
DEFAULT_LIMIT = 8
"""GPUs asked to change per round at most."""
EVENT_SKIPPED = "GpupoolMigRepartitionSkipped"
NOT_LISTED = ("TenantQuotas, GPUPermissions and node labels are not listed yet: no GPU is "
              "repartitioned until they are")


@dataclass(frozen=True, slots=True)
class Ask:
    """One layout to ask of a GPU's node agent."""

    device: str  # the GPU's GPUDevice name
    layout: str
    reason: str


@dataclass(frozen=True, slots=True)
class Skip:
    """A waiting pod no GPU is repartitioned for, and why."""

    namespace: str
    name: str
    uid: str
    check: str  # what refuses it: quota, group, class (``core.reasons.Check``) or unusable
    reason: str


@dataclass(frozen=True, slots=True)
class Round:
    """What one round asks, whom it skips, and (``waiting_for``) why it planned nothing."""

    asks: tuple[Ask, ...] = ()
    skipped: tuple[Skip, ...] = ()
    waiting_for: str = ""


class MigApi(Protocol):
    def patch_gpu_device_annotations(self, name: str, annotations: Mapping[str, str]
                                     ) -> Any: ...

    def create_pod_event(self, pod_namespace: str, pod_name: str, pod_uid: str, reason: str,
                         message: str, warning: bool, component: str, host: str,
                         now: datetime) -> None: ...


def asks(observed: Observed, devices: Iterable[Mapping[str, Any]],
         pods: Iterable[Mapping[str, Any]], limit: int = DEFAULT_LIMIT) -> list[Ask]:
    """The layouts to ask this round (pure)."""
    return list(plan_round(observed, devices, pods, limit).asks)


def plan_round(observed: Observed, devices: Iterable[Mapping[str, Any]],
               pods: Iterable[Mapping[str, Any]], limit: int = DEFAULT_LIMIT) -> Round:
    """This round's asks and skipped pods (pure)."""
    waiting = _waiting(pods)
    if not waiting:
        return Round()
    if observed.tenancy is None:
        return Round(waiting_for=NOT_LISTED)
    objects = list(devices)
    busy = _in_flight(objects)
    names = {str((o.get("spec") or {}).get("uuid")): str((o.get("metadata") or {}).get("name"))
             for o in objects}
    state = cluster_state(observed, observed.tenancy.node_labels)
    requests = [r for r, _ in waiting]
    catalogue = catalogue_of(observed, observed.tenancy.quotas, observed.tenancy.permissions)
    served = serve(state, requests, catalogue,
                   _mix(requests, state), lambda node, gpu: gpu.uuid not in busy, limit)
    out = [Ask(names.get(c.gpu, ""), mig.describe_layout(c.after), c.reason)
           for p in served.plans for c in p.changes]
    where = {r.key: at for r, at in waiting}
    return Round(tuple(a for a in out if a.device),
                 tuple(Skip(*where[s.key], s.check, s.reason) for s in served.skipped))


def _waiting(pods: Iterable[Mapping[str, Any]]) -> list[tuple[PodRequest, tuple[str, str, str]]]:
    """Pending pods asking MIG devices, oldest first, with (namespace, name, uid)."""
    found: list[tuple[str, PodRequest, tuple[str, str, str]]] = []
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if spec.get("nodeName") or meta.get("deletionTimestamp") or \
                (pod.get("status") or {}).get("phase", "Pending") != "Pending":
            continue
        try:
            request = pod_request(pod)
            if not request.gpus or not merged_demand(request).mig_profile:
                continue
        except GpupoolError:
            continue
        at = (str(meta.get("namespace") or "default"), str(meta.get("name") or ""),
              str(meta.get("uid") or ""))
        found.append((str(meta.get("creationTimestamp") or ""), request, at))
    return [(r, at) for _, r, at in sorted(found, key=lambda f: f[0])]


def _mix(waiting: list[PodRequest], state: Any) -> dict[str, float]:
    """The profiles' shares of the MIG demand: pods waiting and devices held."""
    counts: Counter[str] = Counter()
    for r in waiting:
        d = merged_demand(r)
        counts[d.mig_profile] += d.count
    for node in state.nodes:
        i = state.node_index(node.name)
        for j, gpu in enumerate(node.gpus):
            if gpu.mig_profile and state.core_free[i, j] < state.core_cap[i, j]:
                counts[gpu.mig_profile] += 1
    return {k: float(v) for k, v in counts.items()}


def _in_flight(objects: list[Mapping[str, Any]]) -> set[str]:
    """GPUs asked a layout their agent has not answered yet."""
    out = set()
    for obj in objects:
        notes = (obj.get("metadata") or {}).get("annotations") or {}
        asked = notes.get(contract.ANNOTATION_LAYOUT)
        if not isinstance(asked, str):
            continue
        status = (obj.get("status") or {}).get("mig") or {}
        answered = status.get("requested") == asked or status.get("layout") == asked
        if not answered:
            out.add(str((obj.get("spec") or {}).get("uuid")))
    return out


class MigPlanner:
    """Writes each round's asks on the GPUDevices; logs, counts and tells (an Event, once per
    pod) the pods it skips."""

    def __init__(self, api: MigApi, limit: int = DEFAULT_LIMIT,
                 clock: Callable[[], float] = time.time, host: str = ""):
        self.api = api
        self.limit = limit
        self.clock = clock
        self.host = host
        self.skipped: Counter[str] = Counter()  # pods skipped, by the refusing check
        self._told: set[str] = set()  # pods skipped already (uid), while they wait
        self._said = ""  # the last ``waiting_for`` logged

    def round(self, observed: Observed, devices: Iterable[Mapping[str, Any]],
              pods: Iterable[Mapping[str, Any]]) -> list[Ask]:
        listed = list(pods)
        try:
            decided = plan_round(observed, devices, listed, self.limit)
        except GpupoolError as exc:  # a bug, not the cluster's fault: the loop goes on
            log.error("MIG on demand: no plan this round: %s", exc)
            return []
        if decided.waiting_for != self._said:
            self._said = decided.waiting_for
            if decided.waiting_for:
                log.warning("MIG on demand: %s", decided.waiting_for)
        self._tell(decided.skipped, listed)
        done = []
        for ask in decided.asks:
            try:
                self.api.patch_gpu_device_annotations(ask.device, {
                    contract.ANNOTATION_LAYOUT: ask.layout,
                    contract.ANNOTATION_REASON: ask.reason[:1024]})
            except KubeError as exc:
                log.warning("cannot ask GPUDevice %s for MIG layout %s: %s (asked again next "
                            "round)", ask.device, ask.layout, exc)
                continue
            log.info("asked GPUDevice %s for MIG layout %s: %s", ask.device, ask.layout,
                     ask.reason)
            done.append(ask)
        return done

    def _tell(self, skipped: Iterable[Skip], pods: list[Mapping[str, Any]]) -> None:
        """Log, count and tell each pod skipped for the first time; forget pods gone."""
        for s in skipped:
            if s.uid in self._told:
                continue
            self._told.add(s.uid)
            self.skipped[s.check] += 1
            message = f"no GPU is repartitioned for this pod's MIG devices: {s.reason}"
            log.info("MIG on demand: pod %s/%s skipped: %s", s.namespace, s.name, s.reason)
            podwrites.tell(self.api, s.namespace, s.name, s.uid, EVENT_SKIPPED, message,
                           True, self.host, datetime.fromtimestamp(self.clock(), UTC))
        if self._told:
            live = {str((p.get("metadata") or {}).get("uid") or "") for p in pods}
            self._told &= live
