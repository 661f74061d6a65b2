"""A ``coordination.k8s.io/v1`` Lease as a leader-election lock: read, create, replace.

``LeaseLock`` holds one Lease (namespace and name) and speaks only its ``spec``, the
record client-go's leader election keeps there: ``holderIdentity``,
``leaseDurationSeconds``, ``acquireTime``, ``renewTime`` (``MicroTime``: RFC 3339 with
exactly six fractional digits, as the API server writes and parses them) and
``leaseTransitions``. Every write names the ``resourceVersion`` it was based on, so of
two candidates that read the same Lease only the first write wins; the other gets
``Conflict`` (``gpupool.kube.errors``). Calls: ``get``, ``create`` and ``update`` of
``leases`` in the lock's namespace (the Role the chart grants), and ``delete`` for a lock
that is let go for good (a gang's claim, docs/gangs.md).

The Lease is sent and read as plain JSON (a generic resource): lightkube's typed
model writes a time with no fraction as ``...:05Z``, which the API server's MicroTime
parser refuses.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lightkube.generic_resource import create_namespaced_resource

from gpupool.kube.api import KubeApi, _translated
from gpupool.kube.errors import KubeError, NotFound

LeaseResource = create_namespaced_resource("coordination.k8s.io", "v1", "Lease", "leases")

MICRO_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """What a Lease's ``spec`` says about its holder ("" holder: nobody holds it)."""

    holder: str = ""
    lease_duration_s: int = 0
    acquire_time: datetime | None = None
    renew_time: datetime | None = None
    transitions: int = 0


@dataclass(frozen=True, slots=True)
class StoredLease:
    """A record as the API server holds it, with the ``resourceVersion`` to update from."""

    record: LeaseRecord
    resource_version: str


def micro_time(when: datetime) -> str:
    """``when`` as a Kubernetes ``MicroTime`` (UTC, six fractional digits)."""
    return when.astimezone(UTC).strftime(MICRO_FORMAT)


def parse_time(text: Any) -> datetime | None:
    """A ``MicroTime`` or ``Time`` string (None when absent or unreadable)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def spec_of(record: LeaseRecord) -> dict[str, Any]:
    """The Lease ``spec`` that carries ``record``."""
    spec: dict[str, Any] = {"holderIdentity": record.holder,
                            "leaseDurationSeconds": record.lease_duration_s,
                            "leaseTransitions": record.transitions}
    if record.acquire_time is not None:
        spec["acquireTime"] = micro_time(record.acquire_time)
    if record.renew_time is not None:
        spec["renewTime"] = micro_time(record.renew_time)
    return spec


def record_of(spec: Any) -> LeaseRecord:
    """The record a Lease ``spec`` carries (missing or mistyped fields read as unset)."""
    spec = spec if isinstance(spec, dict) else {}

    def number(key: str) -> int:
        value = spec.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    holder = spec.get("holderIdentity")
    return LeaseRecord(holder if isinstance(holder, str) else "", number("leaseDurationSeconds"),
                       parse_time(spec.get("acquireTime")), parse_time(spec.get("renewTime")),
                       number("leaseTransitions"))


class LeaseLock:
    """One Lease through a ``KubeApi``'s client; failures raise ``gpupool.kube.errors``."""

    def __init__(self, api: KubeApi, namespace: str, name: str,
                 notes: dict[str, str] | None = None):
        self.api, self.namespace, self.name = api, namespace, name
        self.notes = notes or {}  # annotations written with every create and update

    def describe(self) -> str:
        return f"Lease {self.namespace}/{self.name}"

    def get(self) -> StoredLease | None:
        """The Lease as stored now (None: there is none)."""
        try:
            with _translated(f"get {self.describe()}"):
                obj = self.api.client.get(LeaseResource, self.name, namespace=self.namespace)
        except NotFound:
            return None
        return _stored(dict(obj), self.describe())

    def create(self, record: LeaseRecord) -> StoredLease:
        """Create the Lease holding ``record`` (``AlreadyExists`` if another was first)."""
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "labels": {"app.kubernetes.io/part-of": "gpupool"},
                             **self._annotations()},
                "spec": spec_of(record)}
        with _translated(f"create {self.describe()}"):
            obj = self.api.client.create(LeaseResource.from_dict(body), namespace=self.namespace)
        return _stored(dict(obj), self.describe())

    def update(self, record: LeaseRecord, resource_version: str) -> StoredLease:
        """Replace the Lease's spec with ``record`` if it is still at ``resource_version``
        (else ``Conflict``: another candidate wrote first)."""
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "resourceVersion": resource_version,
                             "labels": {"app.kubernetes.io/part-of": "gpupool"},
                             **self._annotations()},
                "spec": spec_of(record)}
        with _translated(f"update {self.describe()}"):
            obj = self.api.client.replace(LeaseResource.from_dict(body), self.name,
                                          namespace=self.namespace)
        return _stored(dict(obj), self.describe())

    def delete(self) -> None:
        """Delete the Lease (gone already: nothing to do)."""
        try:
            with _translated(f"delete {self.describe()}"):
                self.api.client.delete(LeaseResource, self.name, namespace=self.namespace)
        except NotFound:
            return

    def _annotations(self) -> dict[str, dict[str, str]]:
        return {"annotations": dict(self.notes)} if self.notes else {}


def _stored(obj: dict[str, Any], what: str) -> StoredLease:
    meta = obj.get("metadata")
    version = meta.get("resourceVersion") if isinstance(meta, dict) else None
    if not isinstance(version, str) or not version:
        raise KubeError(f"{what}: the answer carries no metadata.resourceVersion")
    return StoredLease(record_of(obj.get("spec")), version)
