"""The pods of a DRA node, with which containers use which ResourceClaim.

``ClaimPods`` is the node agent's watch-fed pod cache (``kubeview.KubePods``) that also
remembers, per pod version, ``users.claim_uses`` of the pod's spec and status — the usage
monitor reads it at every sample without asking the API server.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from gpupool.kube.api import KubeApi
from gpupool.nodeagent.dra.users import claim_uses
from gpupool.nodeagent.kubeview import KubePods
from gpupool.nodeagent.pods import Pod


class ClaimPods(KubePods):
    """``KubePods`` plus the claims each pod's containers use (its latest version seen)."""

    def __init__(self, api: KubeApi):
        super().__init__(api)
        self._uses: dict[str, tuple[str, Mapping[str, frozenset[str]]]] = {}
        self._uses_lock = threading.Lock()

    def _parse(self, obj: Any) -> Pod:
        pod = super()._parse(obj)
        with self._uses_lock:
            held = self._uses.get(pod.uid)
            if held is None or held[0] != pod.resource_version:
                self._uses[pod.uid] = (pod.resource_version, claim_uses(obj.to_dict()))
        return pod

    def _on_sync(self, items: list[Any]) -> None:
        super()._on_sync(items)
        keep = {str(o.metadata.uid) for o in items}
        with self._uses_lock:
            self._uses = {u: v for u, v in self._uses.items() if u in keep}

    def _on_event(self, kind: str, obj: Any) -> None:
        super()._on_event(kind, obj)
        if kind == "DELETED":
            with self._uses_lock:
                self._uses.pop(str(obj.metadata.uid), None)

    def uses(self, pod: Pod) -> Mapping[str, frozenset[str]]:
        """Container -> claim names of ``pod`` (as the cache last saw it)."""
        with self._uses_lock:
            held = self._uses.get(pod.uid)
            return held[1] if held is not None else {}
