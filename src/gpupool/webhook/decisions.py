"""Who may write gpupool's decision annotations on a pod.

A pod's ``gpupool.io/*`` annotations (except those a user sets: ``gpupool.io/mode``,
``gpupool.io/affinity`` and the burst limits ``gpupool.io/gpu-memory-limit`` and
``gpupool.io/gpu-core-limit``, which bind reads and records in the decision,
``gpupool.io/placement``, ``gpupool.io/healing``, the pod's own opt-out of healing, and
what a labelled gang's member says of its gang: ``gpupool.io/gang-min-count``,
``gpupool.io/gang-together`` and ``gpupool.io/gang-domain-label``)
are gpupool's record of a GPU decision. Nobody may create a pod carrying them, and an
update may add, change or remove them only when the caller's account is allowed that key
(``Writers``): the node agent its phase, reason, device claim and over-use record; the
extender writes decisions only through the Binding (``pods/binding``), which the same
rule checks. Once a pod is bound, nobody may change the user keys bind read
(``BIND_KEYS``: all but ``gpupool.io/healing``). Signatures still protect a decision
that slips past (docs/security.md); this rule makes the attempt visible and early.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpupool.contract import names

PREFIX = "gpupool.io/"
USER_KEYS = frozenset({names.ANNOTATION_MODE, names.ANNOTATION_AFFINITY,
                       names.ANNOTATION_MEMORY_LIMIT, names.ANNOTATION_CORE_LIMIT,
                       names.ANNOTATION_PLACEMENT, names.ANNOTATION_HEALING,
                       names.ANNOTATION_GANG_MIN_COUNT, names.ANNOTATION_GANG_TOGETHER,
                       names.ANNOTATION_GANG_DOMAIN})
DECISION_KEYS = frozenset({
    names.ANNOTATION_ALLOCATION, names.ANNOTATION_NODE, names.ANNOTATION_BIND_TIME,
    names.ANNOTATION_PHASE, names.ANNOTATION_REASON, names.ANNOTATION_SIGNATURE,
    names.ANNOTATION_DEVICES, names.ANNOTATION_RESOURCE_GROUP,
})
"""The decision record; every other ``gpupool.io/`` key but ``USER_KEYS`` is guarded too."""
BIND_KEYS = USER_KEYS - {names.ANNOTATION_HEALING}
"""The user keys bind reads into the decision: fixed once the pod is bound (a change would
say what the decision does not hold, and anything that reads the pod again would read it)."""
WEBHOOK_KEYS = frozenset({names.ANNOTATION_SLICE})
"""Written by the admission webhook itself at creation (a remote slice's name: its mutation
overwrites any value, and ``remote.unexpected`` checks it); guarded on every update."""
CONTROLLER_KEYS = frozenset({names.ANNOTATION_SLICE_STATUS})
"""The controller's record of a remote slice's server."""
REPLACING_KEYS = frozenset({
    names.ANNOTATION_ALLOCATION, names.ANNOTATION_NODE, names.ANNOTATION_BIND_TIME,
    names.ANNOTATION_PHASE, names.ANNOTATION_SIGNATURE, names.ANNOTATION_RESOURCE_GROUP})
"""With remote slices, the extender writes a lost slice's new decision on its bound pod."""
ANNOTATION_OVER_USE = "gpupool.io/over-use"
"""The node agent's record of a container using more than its slice (its monitor)."""
NODE_AGENT_KEYS = frozenset({names.ANNOTATION_PHASE, names.ANNOTATION_REASON,
                             names.ANNOTATION_DEVICES, ANNOTATION_OVER_USE})
NODE_AGENT_DECIDING_KEYS = NODE_AGENT_KEYS | {names.ANNOTATION_ALLOCATION, names.ANNOTATION_NODE,
                                              names.ANNOTATION_BIND_TIME}
"""With ``--decide-unscheduled`` the node agent writes the decision itself (unsigned)."""


def service_account(namespace: str, name: str) -> str:
    """The user name the API server gives a service account's requests."""
    return f"system:serviceaccount:{namespace}:{name}"


@dataclass(frozen=True, slots=True)
class Writers:
    """The guarded annotation keys each user may change on a pod (everyone else: none)."""

    keys_by_user: Mapping[str, frozenset[str]] = field(default_factory=dict)
    binders: frozenset[str] = frozenset()  # users whose Bindings may carry a decision

    def may_change(self, user: str) -> frozenset[str]:
        return self.keys_by_user.get(user, frozenset())


def is_guarded(key: str) -> bool:
    return key.startswith(PREFIX) and key not in USER_KEYS


def annotations_of(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    meta = obj.get("metadata") if obj is not None else None
    notes = meta.get("annotations") if isinstance(meta, Mapping) else None
    return notes if isinstance(notes, Mapping) else {}


def guarded_on_create(obj: Mapping[str, Any] | None) -> list[str]:
    """The guarded keys a new object carries (sorted)."""
    return sorted(str(k) for k in annotations_of(obj) if is_guarded(str(k)))


def changed(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> list[str]:
    """Guarded keys an update adds, changes or removes (sorted)."""
    before, after = annotations_of(old), annotations_of(new)
    keys = {str(k) for k in (*before, *after) if is_guarded(str(k))}
    return sorted(k for k in keys if before.get(k) != after.get(k))


def refuse_create(who: str, keys: list[str]) -> str:
    return (f"{who}: annotation{'s' if len(keys) > 1 else ''} {', '.join(keys)} "
            f"{'are' if len(keys) > 1 else 'is'} written by gpupool only (the record of a GPU "
            "decision, made by gpupool's scheduler at bind); remove "
            f"{'them' if len(keys) > 1 else 'it'} from the pod (or its template). A pod may "
            f"set {', '.join(sorted(USER_KEYS))}")


def refuse_update(who: str, user: str, keys: list[str]) -> str:
    return (f"{who}: {user or 'an anonymous user'} may not add, change or remove "
            f"{', '.join(keys)}: gpupool's decision annotations are written only by "
            "gpupool's extender (in the Binding) and node agents (phase, reason, devices, "
            "over-use)")


def check_pod_write(who: str, user: str, operation: str, old: Mapping[str, Any] | None,
                    new: Mapping[str, Any] | None, writers: Writers) -> str:
    """Why this pod write is refused ("" when it is not)."""
    if operation == "CREATE":
        keys = [k for k in guarded_on_create(new) if k not in WEBHOOK_KEYS]
        return refuse_create(who, keys) if keys else ""
    if operation != "UPDATE":
        return ""
    keys = [k for k in changed(old, new) if k not in writers.may_change(user)]
    if keys:
        return refuse_update(who, user, keys)
    return _refuse_rebind(who, old, new)


def _refuse_rebind(who: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
                   ) -> str:
    """Why an update of a bound pod may not change what bind read ("" when it does not)."""
    spec = old.get("spec") if old is not None else None
    node = spec.get("nodeName") if isinstance(spec, Mapping) else None
    if not node:
        return ""
    before, after = annotations_of(old), annotations_of(new)
    keys = sorted(k for k in BIND_KEYS if before.get(k) != after.get(k))
    if not keys:
        return ""
    return (f"{who} is bound to node {node}: {', '.join(keys)} "
            f"{'are' if len(keys) > 1 else 'is'} read when a pod is bound and recorded in its "
            "GPU decision, so it cannot change afterwards; set it on a new pod")


def check_binding(who: str, user: str, binding: Mapping[str, Any] | None,
                  writers: Writers) -> str:
    """Why this Binding is refused: it carries a decision and ``user`` is not gpupool's."""
    keys = guarded_on_create(binding)
    if not keys or user in writers.binders:
        return ""
    return (f"{who}: {user or 'an anonymous user'} may not bind a pod with gpupool's decision "
            f"annotations ({', '.join(keys)}): only gpupool's extender records decisions")
