"""Which gang a pod belongs to, and what its gang asks (docs/gangs.md).

A pod joins a gang of its own namespace in one of two ways:

* ``spec.schedulingGroup.podGroupName`` names a ``PodGroup`` (``scheduling.k8s.io/v1alpha2``,
  Kubernetes 1.35+ with the ``GenericWorkload`` feature gate). The PodGroup's
  ``spec.schedulingPolicy.gang.minCount`` is the gang's quorum; a ``basic`` policy makes
  no gang (its pods are placed one by one).
* the label ``gpupool.io/gang`` names a gang (clusters without the PodGroup API); the
  annotation ``gpupool.io/gang-min-count`` on its members is the quorum.

A pod with both belongs to the PodGroup (the label is ignored). Where the members must be
is said by ``gpupool.io/gang-together`` (``node``: all on one node; ``domain``: all on
nodes with one value of the node label ``gpupool.io/gang-domain-label``, by default
``topology.kubernetes.io/zone``), an annotation of the PodGroup or of the labelled members.

Readers return values or ``Broken`` with a sentence naming the object and the field; they
never raise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.contract import names
from gpupool.contract.tenancy import Broken
from gpupool.core.gang import Together
from gpupool.core.serving import ZONE_LABEL

INVALID = "GangInvalid"  # the reason of every ``Broken`` here
MAX_MIN_COUNT = 10_000
"""The largest quorum read (a PodGroup's minCount is an int32; no gang comes near)."""


@dataclass(frozen=True, slots=True)
class GangRef:
    """A gang as its members name it: a PodGroup (``native``) or a ``gpupool.io/gang``."""

    namespace: str
    name: str
    native: bool

    @property
    def key(self) -> str:
        """What the gang is called in messages and indexes (unique across both kinds)."""
        return f"{'PodGroup' if self.native else 'gang'} {self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class GangTerms:
    """What a gang asks: its quorum and where its members must be, relative to each other."""

    min_count: int
    together: Together = Together.ANYWHERE
    domain_label: str = ZONE_LABEL


def gang_ref(namespace: str, labels: Mapping[str, str] | None,
             pod_group: str | None) -> GangRef | None:
    """The gang of a pod of ``namespace`` with these labels and
    ``spec.schedulingGroup.podGroupName`` (None: it is in no gang)."""
    if pod_group:
        return GangRef(namespace, pod_group, True)
    labelled = (labels or {}).get(names.LABEL_GANG)
    return GangRef(namespace, labelled, False) if labelled else None


def pod_group_name(spec: Mapping[str, Any] | None) -> str | None:
    """``spec.schedulingGroup.podGroupName`` of a pod's spec as JSON (None when unset)."""
    group = spec.get("schedulingGroup") if isinstance(spec, Mapping) else None
    name = group.get("podGroupName") if isinstance(group, Mapping) else None
    return name if isinstance(name, str) and name else None


def label_terms(ref: GangRef, notes: Mapping[str, str] | None) -> GangTerms | Broken:
    """The terms a labelled gang's member states in its annotations."""
    notes = notes or {}
    text = notes.get(names.ANNOTATION_GANG_MIN_COUNT)
    if text is None:
        return Broken(INVALID, f"{ref.key}: its members carry no "
                               f"{names.ANNOTATION_GANG_MIN_COUNT} annotation (how many must "
                               "be placed together)")
    count = _count(text)
    if count is None:
        return Broken(INVALID, f"{ref.key}: {names.ANNOTATION_GANG_MIN_COUNT} {text!r} is "
                               f"not a whole number from 1 to {MAX_MIN_COUNT}")
    return _where(ref.key, count, notes)


def pod_group_terms(obj: Mapping[str, Any]
                    ) -> tuple[GangRef, GangTerms | Broken | None] | Broken:
    """A PodGroup's gang and its terms (None: a ``basic`` policy, no gang; ``Broken``: a
    gang policy that cannot be read). ``Broken`` alone: a PodGroup without a name."""
    meta = _mapping(obj.get("metadata"))
    name, namespace = meta.get("name"), meta.get("namespace") or "default"
    if not isinstance(name, str) or not name or not isinstance(namespace, str):
        return Broken(INVALID, "a PodGroup without metadata.name")
    ref = GangRef(namespace, name, True)
    spec = obj.get("spec")
    policy = spec.get("schedulingPolicy") if isinstance(spec, Mapping) else None
    gang = policy.get("gang") if isinstance(policy, Mapping) else None
    if gang is None:
        return ref, None  # basic (or no policy): each pod on its own
    count = gang.get("minCount") if isinstance(gang, Mapping) else None
    if isinstance(count, bool) or not isinstance(count, int) or \
            not 1 <= count <= MAX_MIN_COUNT:
        return ref, Broken(INVALID, f"{ref.key}: spec.schedulingPolicy.gang.minCount "
                                    f"{count!r} is not a whole number from 1 to "
                                    f"{MAX_MIN_COUNT}")
    return ref, _where(ref.key, count, _mapping(meta.get("annotations")))


def _where(key: str, count: int, notes: Mapping[str, Any]) -> GangTerms | Broken:
    together = notes.get(names.ANNOTATION_GANG_TOGETHER) or Together.ANYWHERE.value
    try:
        where = Together(together)
    except ValueError:
        return Broken(INVALID, f"{key}: {names.ANNOTATION_GANG_TOGETHER} {together!r} is "
                               f"not one of {', '.join(t.value for t in Together)}")
    label = notes.get(names.ANNOTATION_GANG_DOMAIN) or ZONE_LABEL
    if not isinstance(label, str):
        return Broken(INVALID, f"{key}: {names.ANNOTATION_GANG_DOMAIN} must be a node label")
    return GangTerms(count, where, label)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _count(text: Any) -> int | None:
    if not isinstance(text, str) or not text.isdigit() or len(text) > 6:
        return None
    value = int(text)
    return value if 1 <= value <= MAX_MIN_COUNT else None
