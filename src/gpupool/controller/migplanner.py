"""MIG on demand, the controller's part: which GPU to repartition for the pods waiting.

Off unless ``gpupool controller --mig-on-demand``. Each round, ``asks`` reads:

* the pending pods that ask MIG devices (``mig.gpupool.io/<profile>``; no node yet, not
  being deleted), oldest first;
* the cluster as the controller sees it (``figures.cluster_state``: published GPUs and
  MIG devices, every counted decision reserved);
* what the node agents were already asked (a GPUDevice's ``gpupool.io/mig-layout`` that
  its ``status.mig`` does not show made, refused or failed yet): such a GPU is left
  alone until its agent answers.

For each pod it takes the core's choice (``core.repartition.plan``: grow a GPU beside its
held devices, or rebuild an idle one, whichever strands the fewest compute slices for
the profiles the pending and running MIG pods ask), and carries it out on its scratch
state so that the next pod sees it; every changed GPU gets one ask per round. The
controller does not watch node CPU or memory, so a pod's CPU and memory do not narrow
the choice (kube-scheduler's filters still apply when the pod is placed). ``MigPlanner``
writes each ask as the annotations ``gpupool.io/mig-layout`` and
``gpupool.io/mig-layout-reason`` on the GPU's GPUDevice; the node agent makes the layout
or says why not (``nodeagent.mig``).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpupool.contract import mig as contract
from gpupool.contract.podspec_request import pod_request
from gpupool.controller.figures import cluster_state
from gpupool.controller.observed import Observed
from gpupool.core import mig
from gpupool.core.errors import GpupoolError
from gpupool.core.fit import NO_CONSTRAINTS, feasible
from gpupool.core.repartition import apply, plan
from gpupool.core.request import PodRequest, merged_demand
from gpupool.kube.errors import KubeError

log = logging.getLogger(__name__)
DEFAULT_LIMIT = 8
"""GPUs asked to change per round at most."""


@dataclass(frozen=True, slots=True)
class Ask:
    """One layout to ask of a GPU's node agent."""

    device: str  # the GPU's GPUDevice name
    layout: str
    reason: str


class MigApi(Protocol):
    def patch_gpu_device_annotations(self, name: str, annotations: Mapping[str, str]
                                     ) -> Any: ...


def asks(observed: Observed, devices: Iterable[Mapping[str, Any]],
         pods: Iterable[Mapping[str, Any]], limit: int = DEFAULT_LIMIT) -> list[Ask]:
    """The layouts to ask this round (pure)."""
    objects = list(devices)
    busy = _in_flight(objects)
    names = {str((o.get("spec") or {}).get("uuid")): str((o.get("metadata") or {}).get("name"))
             for o in objects}
    state = cluster_state(observed)
    waiting = _waiting(pods)
    weights = _mix(waiting, state)
    out: list[Ask] = []
    for request in waiting:
        if len(out) >= limit:
            break
        if feasible(state, request)[0].any():
            continue  # a device is free already: kube-scheduler will place it
        chosen = plan(state, request, NO_CONSTRAINTS, weights,
                      lambda node, gpu: gpu.uuid not in busy)
        if chosen is None:
            continue
        for change in chosen.changes:
            busy.add(change.gpu)
            out.append(Ask(names.get(change.gpu, ""), mig.describe_layout(change.after),
                           change.reason))
        apply(state, chosen)
    return [a for a in out if a.device]


def _waiting(pods: Iterable[Mapping[str, Any]]) -> list[PodRequest]:
    """Pending pods asking MIG devices, oldest first."""
    found: list[tuple[str, PodRequest]] = []
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
        found.append((str(meta.get("creationTimestamp") or ""), request))
    return [r for _, r in sorted(found, key=lambda pair: pair[0])]


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
    """Writes each round's asks on the GPUDevices."""

    def __init__(self, api: MigApi, limit: int = DEFAULT_LIMIT):
        self.api = api
        self.limit = limit

    def round(self, observed: Observed, devices: Iterable[Mapping[str, Any]],
              pods: Iterable[Mapping[str, Any]]) -> list[Ask]:
        done = []
        for ask in asks(observed, devices, pods, self.limit):
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

