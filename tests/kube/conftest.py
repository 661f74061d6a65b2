"""Fixtures: a FAKE API server on loopback and a real lightkube-backed ``KubeApi`` on it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.kube.api import KubeApi


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def api(fake: FakeApiServer) -> Iterator[KubeApi]:
    client = KubeApi.connect(server=fake.url)
    yield client
    client.close()
