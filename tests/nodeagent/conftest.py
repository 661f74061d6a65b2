"""Fixtures: the FAKE API server, a FAKE GPU file, the FAKE kubelet, and a running agent."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.kube.api import KubeApi
from gpupool.nodeagent.agent import AgentConfig, NodeAgent
from gpupool.nodeagent.fakegpus import FakeGpuBackend
from gpupool.nodeagent.kubeview import KubeInventory, KubePods
from gpupool.nodeagent.logical import Split

from .builders import NODE, write_gpus
from .kubelet_standin import FakeKubelet


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short temporary directory (unix socket paths must stay under 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="gp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    with FakeApiServer() as api:
        yield api


@pytest.fixture
def kubelet(short_dir: Path) -> Iterator[FakeKubelet]:
    k = FakeKubelet(short_dir / "kubelet").start()
    yield k
    k.stop()


AgentFactory = Callable[..., NodeAgent]


@pytest.fixture
def make_agent(short_dir: Path, apiserver: FakeApiServer) -> Iterator[AgentFactory]:
    started: list[tuple[NodeAgent, KubePods, KubeApi]] = []

    def make(gpus: int = 2, split: int = 4, memory_mib: int = 16384, heartbeat_s: float = 30.0,
             inventory: bool = False, start: bool = True, cache: bool = True) -> NodeAgent:
        path = write_gpus(short_dir / "gpus.yaml", gpus, memory_mib)
        api = KubeApi.connect(server=apiserver.url)
        config = AgentConfig(NODE, short_dir / "kubelet", Split(split), heartbeat_s=heartbeat_s,
                             watch_s=0.02)
        pods = KubePods(api)
        agent = NodeAgent(config, FakeGpuBackend(path, poll_s=0.02), pods,
                          KubeInventory(api.fork()) if inventory else None)
        started.append((agent, pods, api))
        if start:
            if cache:
                pods.start(NODE)
            agent.start()
        return agent

    yield make
    for agent, _, _ in started:
        agent.stop()
    apiserver.stop()  # ends the pod watches, so the caches stop at once
    for _, pods, api in started:
        pods.stop()
        api.close()
