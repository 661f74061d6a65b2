"""Fixtures: the FAKE API server, a FAKE GPU file, the FAKE kubelet, and a running agent."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.kube.api import KubeApi
from gpupool.kube.keystore import KeyRingSource, publish
from gpupool.nodeagent.agent import AgentConfig, Guards, NodeAgent
from gpupool.nodeagent.fakegpus import FakeGpuBackend
from gpupool.nodeagent.kubeview import KubeEvents, KubeEvictions, KubeInventory, KubePods
from gpupool.nodeagent.logical import Split

from .builders import KEYS, NAMESPACE, NODE, write_gpus
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
def make_agent(short_dir: Path, apiserver: FakeApiServer,
               request: pytest.FixtureRequest) -> Iterator[AgentFactory]:
    started: list[tuple[NodeAgent, KubePods, KubeApi]] = []

    def make(gpus: int = 2, split: int = 4, memory_mib: int = 16384, heartbeat_s: float = 30.0,
             inventory: bool = False, start: bool = True, cache: bool = True,
             decide_unscheduled: bool = False, monitor_s: float = 3600.0,
             proc_root: Path | None = None,
             provider_for: Callable[[FakeGpuBackend], Any] | None = None,
             slice_client: tuple[tuple[str, str], ...] = (), **guards: Any) -> NodeAgent:
        """An agent on the FAKE GPUs; decisions verified with the test cluster's keys
        (published in the FAKE API server) unless ``decide_unscheduled``; ``guards``
        override parts of ``Guards`` (provider, exposure, action, overuse, metrics);
        ``provider_for`` makes the isolation provider from the FAKE GPU backend."""
        path = write_gpus(short_dir / "gpus.yaml", gpus, memory_mib)
        api = KubeApi.connect(server=apiserver.url)
        publish(api, NAMESPACE, KEYS)
        config = AgentConfig(NODE, short_dir / "kubelet", Split(split), heartbeat_s=heartbeat_s,
                             watch_s=0.02, decide_unscheduled=decide_unscheduled,
                             monitor_s=monitor_s, proc_root=proc_root or short_dir / "proc",
                             key_patience_s=0.5,  # refusals for unreadable keys come sooner
                             slice_client=slice_client)
        pods = KubePods(api)
        keys = KeyRingSource(api, NAMESPACE, time.time)
        parts = Guards(verifier=keys.verify, events=KubeEvents(api, NODE),
                       evictions=KubeEvictions(api))
        for key, value in guards.items():
            setattr(parts, key, value)
        backend = FakeGpuBackend(path, poll_s=0.02)
        if provider_for is not None:
            parts.provider = provider_for(backend)
        agent = NodeAgent(config, backend, pods,
                          KubeInventory(api.fork()) if inventory else None, guards=parts)
        started.append((agent, pods, api))
        if start:
            if cache:
                pods.start(NODE)
            agent.start()
        return agent

    yield make
    kubelet = request.node.funcargs.get("kubelet")
    if isinstance(kubelet, FakeKubelet):  # its ListAndWatch streams end first, so the agents'
        kubelet.stop()  # gRPC servers stop without waiting out their grace for them
    for agent, _, _ in started:
        agent.stop()
    apiserver.stop()  # ends the pod watches, so the caches stop at once
    for _, pods, api in started:
        pods.stop()
        api.close()
