"""Fixtures: a DRA agent on FAKE GPUs, talking to the FAKE API server, and the FAKE
kubelet's DRA side (the conftest one level up gives ``short_dir`` and ``apiserver``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.kube.api import DraApi
from gpupool.nodeagent.dra.claimsource import KubeDraCluster
from gpupool.nodeagent.dra.plugin import DraAgent, DraConfig
from gpupool.nodeagent.fakegpus import FakeGpuBackend
from gpupool.nodeagent.kubeview import KubeInventory

from ..builders import NODE, write_gpus
from .kubelet_dra import FakeDraKubelet

DraFactory = Callable[..., DraAgent]


@pytest.fixture
def make_dra(short_dir: Path, apiserver: FakeApiServer) -> Iterator[DraFactory]:
    running: list[tuple[DraAgent, DraApi]] = []

    def make(gpus: int = 2, memory_mib: int = 16384, start: bool = True,
             inventory: bool = False, write: bool = True, **kwargs: Any) -> DraAgent:
        """A DRA agent for NODE on ``gpus`` FAKE GPUs (``write=False``: the GPU file of an
        earlier agent is kept)."""
        gpu_file = short_dir / "gpus.yaml"
        if write or not gpu_file.exists():
            write_gpus(gpu_file, gpus, memory_mib)
        api = DraApi.connect(server=apiserver.url)
        config = DraConfig(NODE, short_dir / "kubelet", short_dir / "cdi", short_dir / "state",
                           resync_s=kwargs.pop("resync_s", 60.0), watch_s=0.05)
        agent = DraAgent(config, FakeGpuBackend(gpu_file, poll_s=0.02), KubeDraCluster(api),
                         KubeInventory(api.fork()) if inventory else None, **kwargs)
        running.append((agent, api))
        if start:
            agent.start()
        return agent

    yield make
    for agent, api in running:
        agent.stop()
        api.close()


@pytest.fixture
def dra_kubelet(short_dir: Path) -> Iterator[FakeDraKubelet]:
    k = FakeDraKubelet(short_dir / "kubelet")
    yield k
    k.close()
