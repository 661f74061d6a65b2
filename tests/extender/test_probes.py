"""/readyz: ready only once every kind a decision reads is listed AND the verbs' server
listens, so the Service never sends kube-scheduler to a replica whose verb port is closed."""

from __future__ import annotations

from starlette.testclient import TestClient

from gpupool.extender.edge.app import build_probes
from gpupool.extender.metrics import Metrics
from gpupool.extender.service import READY_KINDS, Extender, Settings
from gpupool.extender.state.cache import ClusterCache


def extender(listed: bool) -> Extender:
    cache = ClusterCache()
    if listed:
        cache.synced |= set(READY_KINDS)
    return Extender(cache, Settings("best-fit"), Metrics())


def test_a_replica_whose_verbs_server_is_not_listening_yet_is_not_ready() -> None:
    listening = [False]
    with TestClient(build_probes(extender(True), lambda: listening[0])) as probes:
        waiting = probes.get("/readyz")
        assert waiting.status_code == 503
        assert waiting.json()["waiting for"] == ["the verbs' server to listen"]
        assert probes.get("/healthz").status_code == 200  # alive all the same
        listening[0] = True
        assert probes.get("/readyz").status_code == 200


def test_a_listening_replica_that_has_not_listed_everything_names_what_it_waits_for() -> None:
    with TestClient(build_probes(extender(False), lambda: True)) as probes:
        answer = probes.get("/readyz")
    assert answer.status_code == 503
    assert set(answer.json()["waiting for"]) == set(READY_KINDS)
