"""Who may preempt for a remote slice, and who may be preempted: pods read as values.

``waiting`` reads the pending ``remote-required`` pods that may preempt (``Waiting``): no
node yet, not being deleted, phase ``Pending``, asking GPUs, ``spec.preemptionPolicy`` not
``Never``, and refused by kube-scheduler (``PodScheduled`` ``False``, reason
``Unschedulable``) for at least the grace period. A pod that cannot be read — a broken
annotation, a ``spec.priority`` that is not an integer, a ``spec.nodeSelector`` that is
not a map of strings, a required node affinity that is not one, a condition time that is
not a time — is a ``Skip`` with the reason, never an error.

Where a pod may run (``Waiting.admits``) is read as kube-scheduler reads it: every pair of
``spec.nodeSelector`` and, when ``spec.affinity.nodeAffinity`` has
``requiredDuringSchedulingIgnoredDuringExecution``, one of its ``nodeSelectorTerms`` (a
term: all of its ``matchExpressions`` over the node's labels, with the core's selector
requirements, and all of its ``matchFields`` over ``metadata.name``; an empty term matches
no node; ``Gt``/``Lt`` compare integers). Taints and tolerations are not read.

``candidates`` reads the pods gpupool placed (``Observed.holdings``: decisions signed for
them) as the core's ``Candidate`` values, with the priority each pod's ``spec.priority``
gives. A gang's members are never candidates: a single pod does not evict a gang
(docs/gangs.md), so a gang goes whole or not at all. Pure: the time is passed in.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpupool.contract.gangs import gang_ref, pod_group_name
from gpupool.contract.podspec_request import pod_request
from gpupool.controller.observed import PodHolding
from gpupool.core.errors import InvalidInput
from gpupool.core.quota import Charge, amount_of_allocation
from gpupool.core.request import PodRequest, Serving
from gpupool.core.selector import Operator, Requirement
from gpupool.core.victims import Candidate

NAME_FIELD = "metadata.name"  # the one field matchFields may name
_INTEGER = re.compile(r"-?[0-9]+")


@dataclass(frozen=True, slots=True)
class NodeTerm:
    """One ``nodeSelectorTerm`` of a required node affinity: all of ``labels`` (its
    matchExpressions) over the node's labels and all of ``fields`` (its matchFields) over
    the node's name; an empty term matches no node."""

    labels: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        if not self.labels and not self.fields:
            return False
        return all(_holds(r, labels) for r in self.labels) and \
            all(_holds(r, {NAME_FIELD: name}) for r in self.fields)


def _holds(req: Requirement, labels: Mapping[str, str]) -> bool:
    """``req`` over ``labels``; ``Gt``/``Lt`` only over an integer value, as kube-scheduler
    compares them (the core's requirement compares quantities)."""
    if req.operator in (Operator.GT, Operator.LT) and \
            not _INTEGER.fullmatch(labels.get(req.key, "")):
        return False
    return req.matches(labels)


@dataclass(frozen=True, slots=True)
class Waiting:
    """A pending remote-required pod that may preempt."""

    uid: str
    namespace: str
    name: str
    priority: int
    request: PodRequest
    created: str  # metadata.creationTimestamp, as written (RFC 3339 sorts as text)
    selector: tuple[tuple[str, str], ...] = ()  # spec.nodeSelector: where it may run
    terms: tuple[NodeTerm, ...] = ()  # its required node affinity (empty: none)

    @property
    def pod(self) -> str:
        return f"{self.namespace}/{self.name}"

    def admits(self, node: str, labels: Mapping[str, str]) -> bool:
        """Whether the pod may run on node ``node`` with ``labels``: every nodeSelector
        pair, and one term of its required node affinity when it has one."""
        if any(labels.get(k) != v for k, v in self.selector):
            return False
        return not self.terms or any(t.matches(node, labels) for t in self.terms)


@dataclass(frozen=True, slots=True)
class Skip:
    """A pending remote-required pod left waiting, and why (a sentence)."""

    uid: str
    pod: str
    reason: str
    invalid: bool = False  # the pod could not be read (else: it may not, or need not, preempt)


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _where(pod: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = _map(pod.get("metadata"))
    ns, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
    return str(meta.get("uid") or f"{ns}/{name}"), ns, name


def uid_of(pod: Mapping[str, Any]) -> str:
    """The pod's uid (``namespace/name`` when it has none)."""
    return _where(pod)[0]


def _pending(pod: Mapping[str, Any]) -> bool:
    meta, spec = _map(pod.get("metadata")), _map(pod.get("spec"))
    return not spec.get("nodeName") and not meta.get("deletionTimestamp") and \
        _map(pod.get("status")).get("phase", "Pending") == "Pending"


def priority_of(pod: Mapping[str, Any]) -> int:
    """``spec.priority`` (0 when unset, as kube-scheduler reads it); ``InvalidInput`` when
    it is not an integer."""
    value = _map(pod.get("spec")).get("priority")
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidInput(f"spec.priority {value!r:.40} is not an integer")
    return value


def _selector(pod: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    value = _map(pod.get("spec")).get("nodeSelector")
    if value is None:
        return ()
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise InvalidInput("spec.nodeSelector is not a map of strings")
    return tuple(sorted(value.items()))


AFFINITY = "spec.affinity.nodeAffinity"


def _terms(pod: Mapping[str, Any]) -> tuple[NodeTerm, ...]:
    """The required node affinity's terms (empty: none); ``InvalidInput`` names what is
    not one."""
    node = _map(_map(_map(pod.get("spec")).get("affinity")).get("nodeAffinity"))
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return ()
    terms = _map(required).get("nodeSelectorTerms")
    if not isinstance(terms, list):
        raise InvalidInput(f"{AFFINITY}: nodeSelectorTerms is not a list")
    try:
        return tuple(NodeTerm(_requirements(_map(t).get("matchExpressions"), False),
                              _requirements(_map(t).get("matchFields"), True))
                     for t in terms)
    except InvalidInput as exc:
        raise InvalidInput(f"{AFFINITY}: {exc}") from None


def _requirements(raw: Any, fields: bool) -> tuple[Requirement, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InvalidInput(f"{'matchFields' if fields else 'matchExpressions'} is not a list")
    out = []
    for r in raw:
        r = _map(r)
        key, op, values = r.get("key"), r.get("operator"), r.get("values") or []
        try:
            operator = Operator(op)
        except ValueError:
            known = ", ".join(o.value for o in Operator)
            raise InvalidInput(f"operator {op!r:.40} is not one of {known}") from None
        if not isinstance(key, str) or not isinstance(values, list) or \
                not all(isinstance(v, str) for v in values):
            raise InvalidInput(f"a requirement on {key!r:.40} needs a key and values that "
                               "are strings")
        if fields and key != NAME_FIELD:
            raise InvalidInput(f"matchFields key {key!r:.40} is not {NAME_FIELD}")
        if operator in (Operator.GT, Operator.LT) and (
                len(values) != 1 or not _INTEGER.fullmatch(values[0])):
            raise InvalidInput(f"{key} {operator.value} needs one integer, got "
                               f"{values!r:.40}")
        out.append(Requirement(key, operator, tuple(values)))
    return tuple(out)


def unschedulable_since(pod: Mapping[str, Any]) -> float | None:
    """When kube-scheduler last found no node for the pod (epoch seconds; None: it has not,
    or is trying); ``InvalidInput`` when the condition's time cannot be read."""
    conditions = _map(pod.get("status")).get("conditions")
    for c in conditions if isinstance(conditions, list) else ():
        c = _map(c)
        if c.get("type") != "PodScheduled":
            continue
        if c.get("status") != "False" or c.get("reason") != "Unschedulable":
            return None
        stamp = c.get("lastTransitionTime")
        try:
            return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise InvalidInput(f"condition PodScheduled has lastTransitionTime "
                               f"{stamp!r:.40}, not a time") from None
    return None


def waiting(pods: Iterable[Mapping[str, Any]], now: float, grace_s: float
            ) -> tuple[list[Waiting], list[Skip], float | None]:
    """The pods that may preempt for a remote slice now, highest priority first, then
    oldest; the remote-required pods left waiting with why; and when the grace of the
    next pod still within it ends (None: none is)."""
    out: list[Waiting] = []
    skips: list[Skip] = []
    due: list[float] = []
    for pod in pods:
        if not _pending(pod):
            continue
        uid, ns, name = _where(pod)
        try:
            found = _read(pod, uid, ns, name)
        except InvalidInput as exc:
            skips.append(Skip(uid, f"{ns}/{name}", str(exc), True))
            continue
        if isinstance(found, tuple):
            since, w = found
            if now - since >= grace_s:
                out.append(w)
            else:
                due.append(since + grace_s)
        elif found is not None:
            skips.append(found)
    out.sort(key=lambda w: (-w.priority, w.created, w.uid))
    return out, skips, min(due, default=None)


def _read(pod: Mapping[str, Any], uid: str, ns: str, name: str
          ) -> tuple[float, Waiting] | Skip | None:
    """(since when kube-scheduler found no node, the pod), a Skip, or None: not a
    remote-required GPU pod, or not refused (kube-scheduler is still trying)."""
    request = pod_request(pod)
    if not request.gpus or request.serving is not Serving.REMOTE_REQUIRED:
        return None
    priority = priority_of(pod)
    selector, terms = _selector(pod), _terms(pod)
    if _map(pod.get("spec")).get("preemptionPolicy") == "Never":
        return Skip(uid, f"{ns}/{name}", "its preemptionPolicy is Never")
    if in_gang(pod):  # the extender refuses them: room made for one would serve nobody
        return Skip(uid, f"{ns}/{name}", "evicting others would not help: a gang's members "
                    "cannot have remote GPU slices")
    since = unschedulable_since(pod)
    if since is None:
        return None
    created = str(_map(pod.get("metadata")).get("creationTimestamp") or "")
    return since, Waiting(uid, ns, name, priority, request, created, selector, terms)


def in_gang(pod: Mapping[str, Any]) -> bool:
    meta = _map(pod.get("metadata"))
    labels = {str(k): str(v) for k, v in _map(meta.get("labels")).items()}
    return gang_ref(str(meta.get("namespace") or "default"), labels,
                    pod_group_name(_map(pod.get("spec")))) is not None


def _readable_priority(pod: Mapping[str, Any]) -> bool:
    try:
        priority_of(pod)
    except InvalidInput:
        return False
    return True


def candidates(holdings: Iterable[PodHolding], pods: Mapping[str, Mapping[str, Any]],
               leaving: Collection[str] = ()) -> list[Candidate]:
    """The placed pods as candidates (``pods``: uid -> the pod object); being deleted, or in
    ``leaving`` (evicted, not yet seen deleted), makes one leaving; gang members, and pods
    whose ``spec.priority`` cannot be read (never evicted on a guess), are left out."""
    out = []
    for h in sorted(holdings, key=lambda h: h.key):
        pod = pods.get(h.key, {})
        if in_gang(pod) or not _readable_priority(pod):
            continue
        gone = h.key in leaving or bool(_map(pod.get("metadata")).get("deletionTimestamp"))
        charge = Charge(amount_of_allocation(h.allocation), h.tenant, h.gpu_class, h.group)
        out.append(Candidate(h.allocation, h.priority, charge, (), gone, h.bound_s))
    return out


def bound(pods: Iterable[Mapping[str, Any]]) -> set[str]:
    """The uids of ``pods`` bound to a node (``spec.nodeName`` set)."""
    return {uid_of(p) for p in pods if _map(p.get("spec")).get("nodeName")}
