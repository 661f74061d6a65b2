"""What the DRA verbs use of the extender that serves them (``service.Extender`` is one):
its cache, metrics, placer and random source, and its memoised pod requests and node-name
tables, so that claim pods are read and matched exactly as device-plugin pods are."""

from __future__ import annotations

import random
from typing import Any, Protocol

from gpupool.core.placement import Placer
from gpupool.core.request import PodRequest
from gpupool.core.state import ClusterState
from gpupool.extender.metrics import Metrics
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.wire.nodenames import NameTable


class Host(Protocol):
    """The extender as the DRA verbs see it."""

    @property
    def cache(self) -> ClusterCache: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def placer(self) -> Placer: ...

    @property
    def rng(self) -> random.Random: ...

    def _request(self, pod: Any, pod_json: bytes | None = None) -> PodRequest: ...

    def _table(self, state: ClusterState) -> NameTable: ...
