"""Gang claims: one Lease per gang in the extender's namespace, the compare-and-swap two
extender replicas share so that only one of them places a gang (docs/gangs.md, "Two
extender replicas"; docs/protocol.md). Created, or replaced at the version read once it
expired; deleted by its holder when the gang is done; it expires by itself otherwise.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from gpupool.contract.gangs import GangRef
from gpupool.kube.api import KubeApi
from gpupool.kube.errors import AlreadyExists, Conflict, KubeError
from gpupool.kube.lease import LeaseLock, LeaseRecord

log = logging.getLogger(__name__)

GANG_TIMEOUT_S = 300.0
"""How long a gang's holds wait for its members to bind: kube-scheduler's GangScheduling
plugin lets members wait at Permit for 5 minutes."""
CLAIM_PREFIX = "gpupool-gang-"
CLAIM_ANNOTATION = "gpupool.io/gang"  # on a claim: the gang it is for, as messages name it


@dataclass(frozen=True, slots=True)
class GangSettings:
    """``timeout_s``: how long holds wait for their members' binds; ``namespace``: where
    the claims (Leases) are; ``instance``: this replica, as claims name their holder."""

    timeout_s: float = GANG_TIMEOUT_S
    namespace: str = "gpupool-system"
    instance: str = "gpupool-extender"


def claim_name(ref: GangRef) -> str:
    """The Lease that claims ``ref`` (names are DNS labels: the gang's key hashed)."""
    return CLAIM_PREFIX + hashlib.sha256(ref.key.encode()).hexdigest()[:24]


class GangClaims:
    """One Lease per gang, the compare-and-swap two replicas share: whoever creates it (or
    replaces it at the version read once it expired) places the gang."""

    def __init__(self, kube: KubeApi, settings: GangSettings, clock: Callable[[], float]):
        self.kube, self.settings, self.clock = kube, settings, clock

    def _lock(self, ref: GangRef) -> LeaseLock:
        return LeaseLock(self.kube, self.settings.namespace, claim_name(ref),
                         {CLAIM_ANNOTATION: ref.key})

    def take(self, ref: GangRef) -> str:
        """'' when this replica now holds the claim, else who holds it (or why not)."""
        now = datetime.fromtimestamp(self.clock(), UTC)
        mine = LeaseRecord(self.settings.instance, max(1, math.ceil(self.settings.timeout_s)),
                           now, now)
        lock = self._lock(ref)
        try:
            lock.create(mine)
            return ""
        except AlreadyExists:
            pass
        except KubeError as exc:
            return f"its claim could not be written ({exc})"
        try:
            stored = lock.get()
            if stored is None:
                lock.create(mine)
                return ""
            held = stored.record
            ends = held.renew_time.timestamp() + held.lease_duration_s \
                if held.renew_time is not None else 0.0
            if held.holder and held.holder != self.settings.instance and ends > self.clock():
                return f"extender replica {held.holder}"
            lock.update(replace(mine, transitions=held.transitions + 1),
                        stored.resource_version)
            return ""
        except (AlreadyExists, Conflict):
            return "another extender replica"
        except KubeError as exc:
            return f"its claim could not be written ({exc})"

    def release(self, ref: GangRef) -> None:
        try:
            self._lock(ref).delete()
        except KubeError as exc:  # it expires anyway
            log.warning("releasing the claim of %s: %s", ref.key, exc)
