"""Fixtures: a FAKE API server with a small GPU cluster, and an extender replica on it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from .builders import Replica, seed_cluster


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def nodes(fake: FakeApiServer) -> list[str]:
    """Three nodes with two 40 GiB A100s each."""
    return seed_cluster(fake, 3, 2)


@pytest.fixture
def replica(fake: FakeApiServer, nodes: list[str]) -> Iterator[Replica]:
    r = Replica(fake)
    yield r
    r.close()
