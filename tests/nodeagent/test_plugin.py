"""The device plugin over real unix sockets, driven by the FAKE kubelet."""

from __future__ import annotations

import time

from gpupool.nodeagent.fakegpus import FakeGpuBackend

from .builders import uuid_of
from .conftest import AgentFactory
from .kubelet_standin import FakeKubelet


def test_plugin_registers_and_streams_every_logical_device(kubelet: FakeKubelet,
                                                          make_agent: AgentFactory) -> None:
    make_agent(gpus=4, split=3)
    kubelet.wait_registrations(1)
    reg = kubelet.registrations[0]
    assert (reg.version, reg.resource_name, reg.endpoint) == ("v1beta1", "gpupool.io/gpu",
                                                              "gpupool.sock")
    assert reg.options.pre_start_required and reg.options.get_preferred_allocation_available
    assert kubelet.options.pre_start_required
    devices = kubelet.wait_update(lambda d: len(d) == 12).devices
    assert all(h == "Healthy" for h, _ in devices.values())
    assert sorted(n for _, n in devices.values()) == [0] * 6 + [1] * 6


def test_count_follows_gpu_memory_without_a_split(kubelet: FakeKubelet,
                                                  make_agent: AgentFactory) -> None:
    make_agent(gpus=2, split=0, memory_mib=8192)  # one logical device per 1024 MiB
    kubelet.wait_registrations(1)
    assert len(kubelet.wait_update(lambda d: len(d) == 16).devices) == 16


def test_kubelet_restart_makes_the_plugin_register_again(kubelet: FakeKubelet,
                                                         make_agent: AgentFactory) -> None:
    agent = make_agent(gpus=1, split=2)
    kubelet.wait_registrations(1)
    kubelet.restart()
    kubelet.wait_registrations(2)
    assert agent.registrations >= 2
    assert agent.socket.path.exists()
    before = len(kubelet.updates)
    kubelet.wait_update(lambda d: len(d) == 2)
    assert len(kubelet.updates) >= before


def test_a_gpu_fault_and_its_recovery_reach_list_and_watch(kubelet: FakeKubelet,
                                                           make_agent: AgentFactory) -> None:
    agent = make_agent(gpus=2, split=2)
    kubelet.wait_registrations(1)
    backend = agent.backend
    assert isinstance(backend, FakeGpuBackend)
    on_gpu0 = [d.id for d in agent.pool.devices() if d.gpu_uuid == uuid_of(0)]
    backend.set_health(uuid_of(0), False, "XID 79")
    sick = kubelet.wait_update(lambda d: all(d[i][0] == "Unhealthy" for i in on_gpu0))
    assert sum(h == "Healthy" for h, _ in sick.devices.values()) == 2
    backend.set_health(uuid_of(0), True)
    kubelet.wait_update(lambda d: len(d) == 4 and all(h == "Healthy" for h, _ in d.values())
                        and kubelet.updates.index(sick) < len(kubelet.updates) - 1)
    assert all(h == "Healthy" for h, _ in kubelet.devices().values())


def test_editing_the_fake_gpu_file_injects_a_fault(kubelet: FakeKubelet,
                                                   make_agent: AgentFactory) -> None:
    agent = make_agent(gpus=2, split=1)
    kubelet.wait_registrations(1)
    backend = agent.backend
    assert isinstance(backend, FakeGpuBackend)
    text = backend.path.read_text()
    time.sleep(0.01)
    backend.path.write_text(text.replace("architecture: ampere\n", "architecture: ampere\n"
                                         "  health: Unhealthy\n", 1))
    update = kubelet.wait_update(lambda d: sorted(h for h, _ in d.values()) ==
                                 ["Healthy", "Unhealthy"])
    assert len(update.devices) == 2


def test_a_vanished_gpu_leaves_the_list_and_comes_back(kubelet: FakeKubelet,
                                                       make_agent: AgentFactory) -> None:
    agent = make_agent(gpus=2, split=2)
    kubelet.wait_registrations(1)
    backend = agent.backend
    assert isinstance(backend, FakeGpuBackend)
    backend.set_present(uuid_of(1), False)
    kubelet.wait_update(lambda d: len(d) == 2)
    assert not agent.known_gpus()[1].healthy and agent.known_gpus()[1].reason == "vanished"
    backend.set_present(uuid_of(1), True)
    kubelet.wait_update(lambda d: len(d) == 4 and kubelet.devices() == d)
    assert agent.known_gpus()[1].healthy
