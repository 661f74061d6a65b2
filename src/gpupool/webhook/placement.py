"""A namespace's say in where its GPU pods' slices are served: a default and a floor for
``gpupool.io/placement``, read from two namespace labels only administrators may set.

* ``tenant.gpupool.io/placement``: what a GPU pod that writes no ``gpupool.io/placement``
  (or an empty one) gets. The mutation writes it on the pod, so the pod is then exactly a
  pod that wrote it (the extender, the controller and the node agent read only the pod).
* ``tenant.gpupool.io/placement-minimum``: the floor. Values are ordered by how remote
  they are, ``local`` < ``remote-allowed`` < ``remote-required``; a pod that writes a value
  below the floor is refused, naming the namespace, the label and what it may write. A pod
  that writes nothing gets the default, else the floor.

Both are under ``tenant.gpupool.io/``, the labels the admission policy
``gpupool-tenant-labels`` lets only administrators add, change or remove. Values are read
as the pod annotation is (trimmed, any case; empty: ``local``).

What cannot be read fails closed, narrowly: a pod is refused over its namespace only when
its placement depends on what cannot be read — a label whose value is no placement, a
default below the floor, a namespace the webhook could not read. A pod that writes
``remote-required`` depends on neither label (nothing is above it); a pod that writes any
value does not depend on the default.

Pure: no I/O (``NamespaceLookup`` is injected; ``webhook.namespaces`` keeps the view).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpupool.contract import names
from gpupool.core.request import Serving
from gpupool.webhook.review import Obj, pointer

LABEL_DEFAULT = "tenant.gpupool.io/placement"
LABEL_MINIMUM = "tenant.gpupool.io/placement-minimum"
LABELS = (LABEL_DEFAULT, LABEL_MINIMUM)
RANK = {Serving.LOCAL: 0, Serving.REMOTE_ALLOWED: 1, Serving.REMOTE_REQUIRED: 2}
"""How remote a placement is: a floor admits its own value and those above it."""
KNOWN = ", ".join(s.value for s in Serving)


@dataclass(frozen=True, slots=True)
class Setting:
    """One label of a namespace: not set (``value`` None, no ``raw``), a placement, or a
    value that is none (``value`` None, ``raw`` the value as written)."""

    value: Serving | None = None
    raw: str | None = None

    @property
    def broken(self) -> bool:
        return self.value is None and self.raw is not None


@dataclass(frozen=True, slots=True)
class NamespacePlacement:
    """What one namespace says of its GPU pods' placement, or why it could not be read."""

    namespace: str
    default: Setting = field(default_factory=Setting)
    minimum: Setting = field(default_factory=Setting)
    unreadable: str = ""  # why the namespace could not be read ("": it was)

    @staticmethod
    def of_labels(namespace: str, labels: Mapping[str, str] | None) -> NamespacePlacement:
        found = labels or {}
        return NamespacePlacement(namespace, _setting(found.get(LABEL_DEFAULT)),
                                  _setting(found.get(LABEL_MINIMUM)))

    @staticmethod
    def unknown(namespace: str, why: str) -> NamespacePlacement:
        return NamespacePlacement(namespace, unreadable=why or "no reason given")


NamespaceLookup = Callable[[str], NamespacePlacement]
"""``namespace -> NamespacePlacement`` (never raises: what cannot be read is ``unknown``)."""


def _setting(raw: Any) -> Setting:
    if raw is None:
        return Setting()
    value = _placement(raw)
    return Setting(value, None if value is not None else str(raw))


def _placement(raw: Any) -> Serving | None:
    """A placement as the pod annotation is read (``contract.podspec_request.serving_of``);
    None: no placement."""
    if raw == "":
        return Serving.LOCAL
    try:
        return Serving(str(raw).strip().lower())
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Settled:
    """The namespace's part in one pod's placement: what to write on it, or why it is
    refused (``code``/``reason``: the answer's status)."""

    write: Serving | None = None
    refusal: str = ""
    code: int = 403
    reason: str = "Forbidden"


def written(annotations: Mapping[str, Any]) -> tuple[bool, Serving | None]:
    """(whether the pod says anything, what): absent or empty says nothing; a value that
    is no placement is (True, None), which the pod's own reader refuses."""
    raw = annotations.get(names.ANNOTATION_PLACEMENT)
    if raw is None or raw == "":
        return False, None
    return True, _placement(raw)


def depends(annotations: Mapping[str, Any]) -> bool:
    """Whether the namespace can change anything for a GPU pod with these annotations: not
    for one that writes ``remote-required`` (above every floor), nor for one whose value is
    no placement (its own reader refuses it)."""
    says, asked = written(annotations)
    return not (says and asked is None) and asked is not Serving.REMOTE_REQUIRED


def settle(who: str, annotations: Mapping[str, Any], ns: NamespacePlacement,
           defaulting: bool) -> Settled:
    """The namespace's part in the placement of the GPU pod ``who`` whose annotations are
    ``annotations``: at the mutation (``defaulting``) the value to write on a pod that says
    nothing; at either step, a refusal for a pod below the floor or depending on what
    cannot be read."""
    if not depends(annotations):
        return Settled()
    says, asked = written(annotations)
    if ns.unreadable:
        return _unreadable(who, ns)
    if ns.minimum.broken:
        return _broken(who, ns, LABEL_MINIMUM, ns.minimum, False)
    if not says and defaulting:
        return _default(who, ns)
    value = asked or Serving.LOCAL
    floor = ns.minimum.value
    if floor is not None and RANK[value] < RANK[floor]:
        what = f"{who}: gpupool.io/placement={value.value}" if says else \
            f"{who} writes no gpupool.io/placement (read as local), which"
        return Settled(refusal=f"{what} is below the minimum of namespace "
                               f"{ns.namespace}, {floor.value} (its label {LABEL_MINIMUM}, "
                               f"set by the cluster's administrators): write "
                               f"{_at_least(floor)}, or leave the annotation out and the "
                               "namespace sets it")
    return Settled()


def _default(who: str, ns: NamespacePlacement) -> Settled:
    """What a pod that says nothing gets: the default, else the floor, else nothing."""
    if ns.default.broken:
        return _broken(who, ns, LABEL_DEFAULT, ns.default, True)
    chosen, floor = ns.default.value or ns.minimum.value, ns.minimum.value
    if chosen is not None and floor is not None and RANK[chosen] < RANK[floor]:
        return Settled(refusal=f"{who}: namespace {ns.namespace}'s default placement "
                               f"{chosen.value} (its label {LABEL_DEFAULT}) is below its "
                               f"minimum {floor.value} (its label {LABEL_MINIMUM}); ask the "
                               "cluster's administrators to correct them, or write "
                               f"gpupool.io/placement: {_at_least(floor)} on the pod")
    return Settled(write=chosen)


def _at_least(floor: Serving) -> str:
    return " or ".join(s.value for s in Serving if RANK[s] >= RANK[floor])


def _broken(who: str, ns: NamespacePlacement, label: str, setting: Setting,
            default: bool) -> Settled:
    way = ", or write gpupool.io/placement on the pod" if default else \
        ", or write gpupool.io/placement: remote-required on the pod (above any minimum)"
    return Settled(refusal=f"{who}: namespace {ns.namespace}'s label {label}="
                           f"{setting.raw!r} is not a placement ({KNOWN}), so gpupool cannot "
                           "tell where this pod's GPU slices may be served; ask the cluster's "
                           f"administrators to correct it{way}")


def _unreadable(who: str, ns: NamespacePlacement) -> Settled:
    return Settled(refusal=f"{who}: gpupool cannot read namespace {ns.namespace} "
                           f"({ns.unreadable}), whose labels {LABEL_DEFAULT} and "
                           f"{LABEL_MINIMUM} may set this pod's placement; try again, or "
                           "write gpupool.io/placement: remote-required on the pod (above "
                           "any minimum)",
                   code=503, reason="ServiceUnavailable")


def with_placement(pod: Mapping[str, Any], value: Serving) -> tuple[Obj, Obj]:
    """``pod`` annotated ``gpupool.io/placement: value`` and the JSONPatch operation that
    does it (an empty value the pod wrote is replaced: ``add`` of an object member does)."""
    meta = pod.get("metadata")
    meta = dict(meta) if isinstance(meta, Mapping) else {}
    notes = meta.get("annotations")
    if isinstance(notes, Mapping):
        op: Obj = {"op": "add", "path": pointer("metadata", "annotations",
                                                names.ANNOTATION_PLACEMENT),
                   "value": value.value}
        meta["annotations"] = {**notes, names.ANNOTATION_PLACEMENT: value.value}
    else:
        meta["annotations"] = {names.ANNOTATION_PLACEMENT: value.value}
        op = {"op": "add", "path": pointer("metadata", "annotations"),
              "value": {names.ANNOTATION_PLACEMENT: value.value}}
    return {**pod, "metadata": meta}, op
