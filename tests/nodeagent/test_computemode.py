"""GPU compute modes set by ``gpupool mps-helper`` (the one process that holds
CAP_SYS_ADMIN) for the node agent's mps provider, over a real unix socket; the GPU driver
is the FAKE GPU backend."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.core.errors import GpupoolError
from gpupool.nodeagent.fakegpus import FakeGpuBackend
from gpupool.nodeagent.isolation.computemode import ComputeModeClient, ComputeModeHelper
from gpupool.nodeagent.isolation.mps import MpsProvider
from gpupool.nodeagent.isolation.mpsdaemon import MpsLayout

from .builders import decision, fake_mps_control, pod, uuid_of, wait_for, write_gpus
from .conftest import AgentFactory
from .kubelet_standin import FakeKubelet


@pytest.fixture
def backend(short_dir: Path) -> FakeGpuBackend:
    return FakeGpuBackend(write_gpus(short_dir / "gpus.yaml", 2))


@pytest.fixture
def helper(short_dir: Path, backend: FakeGpuBackend) -> Iterator[ComputeModeHelper]:
    h = ComputeModeHelper(short_dir / "helper" / "mode.sock", backend,
                          lambda: {g.uuid for g in backend.discover()}, timeout_s=1.0)
    h.start()
    yield h
    h.stop()


def ask(path: Path, raw: bytes) -> dict[str, Any]:
    """Send ``raw`` as it is and read the one-line answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(path))
        sock.sendall(raw)
        sock.shutdown(socket.SHUT_WR)
        with sock.makefile("rb") as answer:
            out: dict[str, Any] = json.loads(answer.readline())
            return out


def test_the_agent_sets_compute_modes_through_the_helper(
        helper: ComputeModeHelper, backend: FakeGpuBackend) -> None:
    client = ComputeModeClient(helper.path)
    client.set_compute_mode(uuid_of(1), True)
    assert backend.compute_modes == {uuid_of(1): True}
    client.set_compute_mode(uuid_of(1), False)
    assert backend.compute_modes == {uuid_of(1): False}


def test_only_the_helpers_user_may_open_its_socket(helper: ComputeModeHelper) -> None:
    assert helper.path.stat().st_mode & 0o777 == 0o600
    assert helper.path.parent.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize(("raw", "words"), [
    (b"not json\n", "a request is a JSON object"),
    (b'["gpu"]\n', '{"gpu": <uuid>, "mode": <mode>} and nothing else'),
    (b'{"gpu": "GPU-x", "mode": "DEFAULT", "also": 1}\n', "and nothing else"),
    (b'{"gpu": "GPU-x", "mode": "PROHIBITED"}\n', "'PROHIBITED' is not one of DEFAULT, "
                                                   "EXCLUSIVE_PROCESS"),
    (b'{"gpu": "GPU-elsewhere", "mode": "DEFAULT"}\n', "'GPU-elsewhere' is not a GPU of this "
                                                        "node"),
    (b'{"gpu": 7, "mode": "DEFAULT"}\n', "'7' is not a GPU of this node"),
    (b'{"gpu": "' + b"x" * 600 + b'", "mode": "DEFAULT"}\n', "at most 512 bytes"),
    (b'{"gpu": "GPU-x"', "one line"),  # the caller stopped before the end of the line
    (b"", "one line"),
])
def test_a_bad_request_gets_an_error_naming_it_and_changes_nothing(
        helper: ComputeModeHelper, backend: FakeGpuBackend, raw: bytes, words: str) -> None:
    answer = ask(helper.path, raw)
    assert words in answer["error"] and "ok" not in answer
    assert backend.compute_modes == {}
    ComputeModeClient(helper.path).set_compute_mode(uuid_of(0), True)  # still serving
    assert backend.compute_modes == {uuid_of(0): True}


def test_a_caller_that_sends_nothing_is_dropped_and_others_are_served_meanwhile(
        helper: ComputeModeHelper, backend: FakeGpuBackend) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as idle:
        idle.connect(str(helper.path))
        ComputeModeClient(helper.path).set_compute_mode(uuid_of(0), True)
        idle.settimeout(30)
        assert idle.recv(1) == b""  # closed by the helper after its read timeout
    assert backend.compute_modes == {uuid_of(0): True}


def test_another_user_is_refused(helper: ComputeModeHelper, backend: FakeGpuBackend,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)  # the helper is someone else
    with pytest.raises(GpupoolError, match=f"user {os.getuid()} may not change compute modes"):
        ComputeModeClient(helper.path).set_compute_mode(uuid_of(0), True)
    assert backend.compute_modes == {}


def test_what_the_driver_says_reaches_the_agent(helper: ComputeModeHelper,
                                                backend: FakeGpuBackend) -> None:
    backend.set_compute_mode_error("NVML: Insufficient Permissions")
    with pytest.raises(GpupoolError, match="the MPS helper: NVML: Insufficient Permissions"):
        ComputeModeClient(helper.path).set_compute_mode(uuid_of(0), True)


def test_a_helper_that_is_not_there_is_waited_for_then_named(
        short_dir: Path, backend: FakeGpuBackend) -> None:
    path = short_dir / "helper" / "mode.sock"
    waits: list[float] = []
    client = ComputeModeClient(path, patience_s=1.0, sleep=waits.append)
    with pytest.raises(GpupoolError, match="DaemonSet gpupool-mps-helper"):
        client.set_compute_mode(uuid_of(0), True)
    assert sum(waits) == pytest.approx(1.0)
    late = ComputeModeHelper(path, backend, lambda: {uuid_of(0)})

    def start_after_a_while(s: float) -> None:
        waits.append(s)
        if len(waits) == 8:
            late.start()

    try:
        ComputeModeClient(path, sleep=start_after_a_while).set_compute_mode(uuid_of(0), True)
    finally:
        late.stop()
    assert backend.compute_modes == {uuid_of(0): True}


def test_an_mps_node_agent_without_capabilities_serves_shared_slices_through_the_helper(
        helper: ComputeModeHelper, backend: FakeGpuBackend, short_dir: Path,
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer) -> None:
    control = fake_mps_control(short_dir)  # the helper outlives the agent: listed first

    def provider(_: FakeGpuBackend) -> MpsProvider:
        return MpsProvider(MpsLayout(short_dir / "mps"), ComputeModeClient(helper.path),
                           str(control), health_s=0.05, timeout_s=30)

    make_agent(gpus=2, split=2, provider_for=provider)
    kubelet.wait_registrations(1)
    kubelet.wait_update(lambda d: len(d) == 4)
    p = pod("p1", [("main", 1, 4096, 30)],
            ann=decision("p1", [(uuid_of(1), 1, 4096, 30, "main")]))
    apiserver.seed("pods", p)
    got = kubelet.admit(p, random.Random(1))
    assert got.envs["main"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert backend.compute_modes == {uuid_of(1): True}  # set by the helper


def test_the_command_serves_until_sigterm_and_leaves_no_socket(short_dir: Path) -> None:
    gpus = write_gpus(short_dir / "gpus.yaml", 1)
    path = short_dir / "helper" / "mode.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpupool.cli.main", "mps-helper", "--socket", str(path),
         "--fake-gpus", str(gpus)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(path.exists)
        ComputeModeClient(path).set_compute_mode(uuid_of(0), True)
        with pytest.raises(GpupoolError, match="is not a GPU of this node"):
            ComputeModeClient(path).set_compute_mode(uuid_of(5), True)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert f"GPU {uuid_of(0)}: compute mode EXCLUSIVE_PROCESS" in out
    assert not path.exists()
