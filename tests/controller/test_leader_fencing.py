"""A round in flight stops writing once the leader's term ends: whatever the moment the
Lease is lost, the writes already sent are a prefix of what the round would have sent and
nothing follows them — against the FAKE API server, with the real clients."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.controller.deviceclasses import DeviceClassSync
from gpupool.controller.loop import Controller, Outcome
from gpupool.kube.api import DraApi
from gpupool.kube.controller_ops import ControllerApi
from tests.controller.builders import GIB, device, group, placed_pod, sign, slices, verify

WRITES = ("POST", "PUT", "PATCH", "DELETE")
CLOCK = "2026-01-02T03:04:05Z"


class _EndsAfter:
    """The real client, but the term ends (``ended`` is set) once ``budget`` writes went out."""

    def __init__(self, api: Any, ended: threading.Event, budget: list[int]):
        self._api, self._ended, self._budget = api, ended, budget

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._api, name)
        if not name.startswith(("create_", "patch_", "replace_", "delete_")):
            return real

        def write(*args: Any, **kwargs: Any) -> Any:
            assert not self._ended.is_set(), f"{name} sent after the term ended"
            try:
                return real(*args, **kwargs)
            finally:
                self._budget[0] -= 1
                if self._budget[0] <= 0:
                    self._ended.set()
        return write


@pytest.fixture
def world() -> Iterator[Callable[[], FakeApiServer]]:
    servers: list[FakeApiServer] = []

    def make() -> FakeApiServer:
        fake = FakeApiServer().__enter__()
        servers.append(fake)
        for obj in (device("n1", 0), device("n1", 1), device("n2", 0, "T4", 16 * GIB)):
            fake.seed("gpudevices", obj)
        fake.seed("resourcegroups", group("team", nodes=["n1"], quota={"gpus": 2}))
        fake.seed("tenantquotas", {"metadata": {"name": "q", "generation": 1},
                                   "spec": {"namespaces": ["lab"], "limits": {"gpus": 2}}})
        fake.seed("pods", sign(placed_pod("a", "lab", "n1", slices("n1", (0, GIB, 10)),
                                          group_name="team")))
        return fake
    yield make
    for fake in servers:
        fake.__exit__(None, None, None)


def _round(fake: FakeApiServer, budget: int) -> tuple[list[tuple[str, str]], Outcome]:
    ended = threading.Event()
    left = [budget]
    api, dra = ControllerApi.open(server=fake.url), DraApi.connect(server=fake.url)
    assert isinstance(dra, DraApi)
    try:
        controller = Controller(_EndsAfter(api, ended, left),  # type: ignore[arg-type]
                                clock=lambda: CLOCK, verify=verify,
                                device_classes=DeviceClassSync(_EndsAfter(dra, ended, left)))
        out = controller.reconcile_once(ended)
    finally:
        api.close()
        dra.close()
    return [r for r in fake.requests if r[0] in WRITES], out


def test_a_round_whose_term_ends_midway_sends_nothing_after(
        world: Callable[[], FakeApiServer]) -> None:
    full, whole = _round(world(), 10_000)
    # the round writes in all three phases: classes, DeviceClasses, tenancy statuses
    assert any("resourceclasses" in p for _, p in full)
    assert any("deviceclasses" in p for _, p in full)
    assert any("tenantquotas" in p for _, p in full)
    assert whole.skipped == 0
    for budget in range(1, len(full)):
        sent, out = _round(world(), budget)
        assert sent == full[:budget], f"term ended after write {budget}"
        assert out.writes == budget
        # counted, except DeviceClasses not even listed because the term ended before them
        assert out.skipped >= 1 or "deviceclasses" in full[budget][1]
        assert (f"{out.skipped} writes skipped" in out.summary()) == (out.skipped > 0)
