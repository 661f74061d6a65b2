"""The controller's two writes about a pod that several of its parts make: an Event, and
an eviction through the Eviction API.

* ``tell``: an Event about the pod from ``gpupool-controller``; one that cannot be
  written is logged, never raised (an Event is a courtesy, not a step of the work).
* ``evict``: ``pods/eviction`` (policy/v1) with the pod's uid as a precondition (a pod
  deleted and made again under the name is not evicted), and what came of it: ``evicted``,
  ``gone`` (already deleted, or replaced under its name), ``blocked`` (HTTP 429: a
  PodDisruptionBudget allows no disruption now) or ``failed`` (another error); the caller
  says why and when it tries again.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Literal, Protocol

from gpupool.kube.errors import Conflict, KubeError, NotFound

log = logging.getLogger(__name__)

COMPONENT = "gpupool-controller"
Evicted = Literal["evicted", "gone", "blocked", "failed"]


class EventWriter(Protocol):
    def create_pod_event(self, pod_namespace: str, pod_name: str, pod_uid: str, reason: str,
                         message: str, warning: bool, component: str, host: str,
                         now: datetime) -> None: ...


class Evicter(Protocol):
    def evict_pod_of(self, namespace: str, name: str, uid: str) -> None: ...


def tell(api: EventWriter, namespace: str, name: str, uid: str, reason: str, message: str,
         warning: bool, host: str, when: datetime) -> None:
    """An Event ``reason`` about pod ``namespace/name``."""
    try:
        api.create_pod_event(namespace, name, uid, reason, message, warning,
                             COMPONENT, host, when)
    except KubeError as exc:
        log.info("Event %s about pod %s/%s not written: %s", reason, namespace, name, exc)


def evict(api: Evicter, namespace: str, name: str, uid: str
          ) -> tuple[Evicted, KubeError | None]:
    """Evict pod ``namespace/name`` if it is still ``uid``: what came of it, and the error
    of a ``blocked`` or ``failed`` one."""
    try:
        api.evict_pod_of(namespace, name, uid)
    except (NotFound, Conflict):
        return "gone", None
    except KubeError as exc:
        return ("blocked" if exc.code == 429 else "failed"), exc
    return "evicted", None
