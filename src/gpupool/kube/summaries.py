"""``PodSummary``: the few fields of a pod that placement bookkeeping reads.

Listing every pod of a big cluster as lightkube's full ``Pod`` model decodes
managed fields, volumes, probes and more that nobody here reads. ``PodSummary``
is a lightkube resource (same URLs as ``Pod``) whose model keeps only
identity, labels, annotations, the node, the containers' resources, the
priority, the PodGroup and the phase; msgspec skips everything else while decoding,
which makes a 50,000-pod list several times faster and smaller. Attribute names are
the API's, so code reading ``pod.metadata.annotations`` or ``pod.spec.containers``
works on both.
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec
from lightkube.core import resource as res
from lightkube.resources.core_v1 import Pod


class SummaryMeta(msgspec.Struct, omit_defaults=True):
    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    resourceVersion: str | None = None
    annotations: dict[str, str] | None = None
    labels: dict[str, str] | None = None
    deletionTimestamp: str | None = None


class SummaryResources(msgspec.Struct, omit_defaults=True):
    requests: dict[str, Any] | None = None
    limits: dict[str, Any] | None = None


class SummaryContainer(msgspec.Struct, omit_defaults=True):
    name: str | None = None
    resources: SummaryResources | None = None


class SummarySchedulingGroup(msgspec.Struct, omit_defaults=True):
    podGroupName: str | None = None  # the pod's PodGroup (its gang, docs/gangs.md)


class SummarySpec(msgspec.Struct, omit_defaults=True):
    nodeName: str | None = None
    schedulerName: str | None = None
    containers: list[SummaryContainer] | None = None
    initContainers: list[SummaryContainer] | None = None
    priority: int | None = None  # set by the API server's Priority admission
    preemptionPolicy: str | None = None  # Never: it preempts nobody (a gang's members too)
    schedulingGroup: SummarySchedulingGroup | None = None


class SummaryStatus(msgspec.Struct, omit_defaults=True):
    phase: str | None = None


class PodSummary(res.NamespacedResourceG, msgspec.Struct, omit_defaults=True):
    """A pod as list/watch of ``pods`` returns it, reduced to what gpupool reads."""

    _api_info: ClassVar[res.ApiInfo] = Pod._api_info  # type: ignore[misc]  # same URLs as Pod
    metadata: SummaryMeta | None = None
    spec: SummarySpec | None = None
    status: SummaryStatus | None = None
