"""What the live ``gpupool inspect`` reports, as plain data (printed as a table, JSON or YAML).

* ``nodes_report``: per node its CPU and memory, its fragmentation (the core's
  measure against the workload the extender would use) and per GPU: model, health,
  isolation, memory and compute allocated of total, the pods holding slices;
* ``pod_report``: one pod's phase, its decision decoded, its signature, and for a
  pending pod asking for GPUs, every node's verdict from the core;
* ``groups_report``: every ResourceGroup with its quota (used / limit) and what each
  tenant (namespace) holds, per class.

Field names follow Kubernetes' camelCase; amounts carry their unit in the name.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gpupool.cli.inspect_cluster import Holder, LiveCluster
from gpupool.cli.inspect_fit import nodes_json, verdicts
from gpupool.contract import annotations as records
from gpupool.contract import names
from gpupool.contract.podspec_request import pod_request
from gpupool.contract.slices import read_status
from gpupool.core.errors import InvalidInput
from gpupool.core.fragmentation import FragmentationModel
from gpupool.core.placement import Placer
from gpupool.core.policies import make_policy
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.quota import Amount, Limit
from gpupool.core.state import MILLI
from gpupool.extender.workload import observed_workload

Report = dict[str, Any]


def _common(live: LiveCluster) -> Report:
    sig = live.signatures
    return {"signatures": {"checked": sig.ring is not None,
                           "keys": sorted(sig.ring.keys) if sig.ring is not None else [],
                           "problem": sig.problem or None},
            "problems": list(live.problems)}


# -- nodes ------------------------------------------------------------------------------------


def nodes_report(live: LiveCluster, only: Sequence[str] = ()) -> Report:
    state = live.state
    missing = sorted(set(only) - set(state.index))
    if missing:
        known = ", ".join(n.name for n in state.nodes[:20]) or "none"
        raise InvalidInput(f"no GPU node named {', '.join(missing)} (nodes with GPUs: {known})")
    workload, source = observed_workload(state, [])
    model = FragmentationModel(workload)
    frag = model.measure(state.free_milli, state.cpu_free, model.access(state)) \
        if state.nodes else np.zeros(0, np.int64)
    rows = [i for i, n in enumerate(state.nodes)  # a remote slice's home without GPUs:
            if n.name in only or (not only and n.gpus)]  # only when named
    return {"kind": "GPUNodes", "fragmentationWorkload": source,
            "nodes": [_node(live, i, int(frag[i]) / workload.total_weight) for i in rows],
            **_common(live)}


def _node(live: LiveCluster, i: int, frag_milli: float) -> Report:
    state = live.state
    node = state.nodes[i]
    free = int(np.maximum(state.free_milli[i], 0).sum())
    return {
        "name": node.name,
        "cpuMilli": {"allocated": int(node.cpu_milli - state.cpu_free[i]),
                     "total": node.cpu_milli},
        "memoryMiB": {"allocated": int(node.memory_mib - state.mem_free[i]),
                      "total": node.memory_mib},
        "fragmentation": {"milliGpu": round(frag_milli), "freeMilliGpu": free,
                          "percentOfFree": round(100 * frag_milli / free, 1) if free else 0.0},
        "gpus": [_gpu(live, i, j) for j in range(len(node.gpus))],
    }


def _gpu(live: LiveCluster, i: int, j: int) -> Report:
    state = live.state
    gpu = state.nodes[i].gpus[j]
    facts = live.gpus[gpu.uuid]
    rec = facts.record
    used_units = int(state.unit_cap[i, j] - state.unit_free[i, j])
    age = facts.heartbeat_age_s
    return {
        "index": gpu.index, "uuid": gpu.uuid, "model": gpu.model,
        "health": "Healthy" if rec.reported_healthy else "Unhealthy",
        "heartbeatAgeSeconds": None if age is None else round(age),
        "stale": facts.stale,
        "isolation": {"state": names.DEVICE_ISOLATED, "reason": rec.isolation_reason}
        if rec.isolated else None,
        "takesPlacements": facts.takes_placements,
        "memoryMiB": {"allocated": used_units * state.memory_unit_mib, "total": gpu.memory_mib},
        "corePct": {"allocated": int(state.core_cap[i, j] - state.core_free[i, j]),
                    "total": int(state.core_cap[i, j])},
        "holders": [{"pod": h.pod, "container": c, "memoryMiB": m, "corePct": k,
                     "signature": h.signature.state, "counted": h.counted,
                     "note": h.why_not or None,
                     "remoteFrom": h.allocation.node if h.allocation.served_by else None}
                    for h, m, k, c in live.holders_on(gpu.uuid)],
    }


# -- one pod ----------------------------------------------------------------------------------


def pod_report(live: LiveCluster, pod: Any, policy: str, seed: int) -> Report:
    """``pod``: a lightkube Pod model; ``pod_json``'s plain form is read for its request."""
    meta, spec, status = pod.metadata, pod.spec, pod.status
    ns, name = meta.namespace or "default", meta.name or ""
    uid = meta.uid or f"{ns}/{name}"
    notes = dict(meta.annotations or {})
    node = (spec.nodeName if spec is not None else None) or None
    report: Report = {
        "kind": "GPUPod", "pod": f"{ns}/{name}", "uid": meta.uid, "node": node,
        "phase": status.phase if status is not None else None,
        "reason": status.reason if status is not None else None,
        "message": status.message if status is not None else None,
        "scheduling": _scheduled_condition(status),
        "group": records.group_of(notes, meta.labels),
        "request": None, "decision": None, "signature": None, "fit": None,
    }
    request = _request(pod, report)
    if records.has_decision(notes):
        report["decision"] = _decision(live, uid, notes, node)
        holder = live.holders.get(uid)
        sig = holder.signature if holder is not None else \
            live.signatures.check(uid, ns, name, notes)
        report["signature"] = {"present": sig.present, "state": sig.state,
                               "key": sig.key or None, "message": sig.message}
    if node is None and request is not None and request.gpus:
        report["fit"] = _fit(live, request, policy, seed)
    report.update(_common(live))
    mine = f"pod {ns}/{name}:"  # other pods' problems belong to the nodes view
    report["problems"] = [p for p in live.problems if not p.startswith("pod ") or
                          p.startswith(mine)]
    return report


def _scheduled_condition(status: Any) -> Report | None:
    for c in (status.conditions or []) if status is not None else []:
        if c.type == "PodScheduled":
            return {"status": c.status, "reason": c.reason, "message": c.message}
    return None


def _request(pod: Any, report: Report) -> Any:
    try:
        request = pod_request(pod.to_dict())
    except InvalidInput as exc:
        report["request"] = {"error": str(exc)}
        return None
    report["request"] = {"describe": request.describe(), "gpus": bool(request.gpus),
                         "tenant": request.tenant, "class": request.gpu_class}
    return request


def _decision(live: LiveCluster, uid: str, notes: Mapping[str, str], node: str | None
              ) -> Report:
    try:
        decision = records.decode(uid, notes)
    except InvalidInput as exc:
        return {"readable": False, "error": str(exc), "counted": False,
                "why": "gpupool cannot read it, so it holds nothing"}
    alloc = decision.allocation
    holder = live.holders.get(uid)
    return {
        "readable": True, "node": alloc.node, "phase": decision.phase,
        "phaseReason": decision.reason or None, "bindTime": decision.bind_time or None,
        "group": notes.get(names.ANNOTATION_RESOURCE_GROUP), "exclusive": alloc.exclusive,
        "cpuMilli": alloc.cpu_milli, "memoryMiB": alloc.memory_mib,
        "gpus": [{"container": s.container, "uuid": s.gpu_uuid, "index": s.gpu_position,
                  "model": _model(live, s.gpu_uuid), "memoryMiB": s.memory_mib,
                  "corePct": s.core_pct} for s in alloc.slices],
        "counted": holder is not None and holder.counted,
        "why": _why_not_held(holder, decision.phase, alloc.node, node),
        "servedBy": alloc.served_by or None,
        "slice": _slice_state(notes) if alloc.served_by else None,
    }


def _slice_state(notes: Mapping[str, str]) -> Report:
    """What the controller says of a remote slice's server (``gpupool.io/slice-status``)."""
    status = read_status(notes)
    if status is None:
        return {"state": None, "server": None, "node": None, "reason": None, "since": None}
    return {"state": status.state.value, "server": status.server or None,
            "node": status.node or None, "reason": status.reason or None,
            "since": status.since or None}


def _model(live: LiveCluster, uuid: str) -> str | None:
    gpu = live.gpus.get(uuid)
    return gpu.record.gpu.model if gpu is not None else None


def _why_not_held(holder: Holder | None, phase: str, decided: str, node: str | None
                  ) -> str | None:
    if holder is not None:
        return holder.why_not or None
    if phase == names.PHASE_FAILED:
        return "the node agent marked it failed, so it holds nothing"
    if node is None:
        return "the pod is not bound to a node, so it holds nothing yet"
    if node != decided:
        return f"it names node {decided} but the pod is bound to {node}, so it holds nothing"
    return "the pod has finished, so it holds nothing"


def _fit(live: LiveCluster, request: Any, policy: str, seed: int) -> Report:
    state = live.state
    workload, _ = observed_workload(state, [request])
    placer = Placer(make_policy(policy, PolicyConfig(workload)))
    found, blocked = verdicts(state, request, live.catalogue, placer, random.Random(seed))
    chosen = next((v.node for v in found if v.chosen), None)
    return {"policy": policy, "chosen": chosen,
            "blocked": blocked.message if blocked is not None else None,
            "fitting": sum(v.allocation is not None for v in found),
            "nodes": nodes_json(found)}


# -- groups and quotas ------------------------------------------------------------------------


def _amounts(used: Amount, limit: Limit | None) -> Report:
    lim = limit or Limit()
    return {"gpus": {"used": used.gpus, "limit": lim.gpus},
            "memoryMiB": {"used": used.memory_mib, "limit": lim.memory_mib},
            "corePct": {"used": used.core_pct, "limit": lim.core_pct}}


def _within(used: Amount, limit: Limit | None) -> bool:
    return limit is None or not any(limit.exceeded(used, Amount()))


def groups_report(live: LiveCluster) -> Report:
    quotas = live.catalogue.quotas
    groups = []
    for name in sorted(live.groups_read):
        problem = live.groups_read[name]
        if problem:
            groups.append({"name": name, "valid": False, "problem": problem})
            continue
        g = live.catalogue.groups.get(name)
        used, limit = quotas.used_by_group(name), quotas.group_limits.get(name)
        member_gpus = int(live.catalogue.groups.gpu_mask(live.state, name).sum()) \
            if live.state.nodes else 0
        groups.append({
            "name": name, "valid": True, "problem": None,
            "tenants": sorted(g.tenants), "models": sorted(g.models),
            "memberGpus": member_gpus, "memberCapacityMilliGpu": member_gpus * MILLI,
            "quota": _amounts(used, limit), "withinQuota": _within(used, limit),
            "pods": sum(1 for h in live.holders.values() if h.counted and h.facts.group == name),
        })
    return {"kind": "GPUGroups", "groups": groups, "tenants": _tenants(live), **_common(live)}


def _tenants(live: LiveCluster) -> list[Report]:
    quotas = live.catalogue.quotas
    classes: dict[str, set[str]] = {}
    for h in live.holders.values():
        if h.counted and h.facts.gpu_class:
            classes.setdefault(h.facts.namespace, set()).add(h.facts.gpu_class)
    out = []
    for tenant in sorted(live.tenants):
        used = quotas.used_by_tenant(tenant)
        out.append({"tenant": tenant,
                    "used": {"gpus": used.gpus, "memoryMiB": used.memory_mib,
                             "corePct": used.core_pct},
                    "classes": {c: quotas.used_by_class(tenant, c).gpus
                                for c in sorted(classes.get(tenant, ()))}})
    return out
