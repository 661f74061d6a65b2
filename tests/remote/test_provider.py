"""The provider's process environment (pinning, isolation limits), its exposure beyond
loopback, and the status endpoint's answers."""

from __future__ import annotations

import json
import socket
from dataclasses import replace
from pathlib import Path

import pytest

from gpupool.contract.isolation import ProviderName
from gpupool.remote import status
from gpupool.remote.provider import Isolation, ProviderError, exposure, pinned_env

from .builders import GPU, slice_spec
from .loops import loop_thread

BASE = {"PATH": "/usr/bin", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=999999M",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "999999m", "LD_PRELOAD": "/tmp/evil.so",
        "CUDA_VISIBLE_DEVICES": "all"}


@pytest.mark.parametrize(("isolation", "expected"), [
    (Isolation(), {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2048M",
                   "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}),
    (Isolation(ProviderName.MPS, mps_pipe_directory="/run/mps/gpu0/pipe"),
     {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2048M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
      "CUDA_MPS_PIPE_DIRECTORY": "/run/mps/gpu0/pipe"}),
    (Isolation(ProviderName.HAMI_CORE, hami_core_library="/usr/local/vgpu/libvgpu.so"),
     {"CUDA_DEVICE_MEMORY_LIMIT_0": "2048m", "CUDA_DEVICE_SM_LIMIT": "25",
      "LD_PRELOAD": "/usr/local/vgpu/libvgpu.so"}),
], ids=["none", "mps", "hami-core"])
def test_the_provider_is_pinned_to_its_gpu_with_the_slices_limits_and_nothing_looser(
        isolation: Isolation, expected: dict[str, str]) -> None:
    env = pinned_env(BASE, slice_spec(memory_mib=2048, core_pct=25), isolation)
    assert env == {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": GPU, **expected}


def test_a_whole_gpu_gets_no_limits_and_hami_core_needs_its_library() -> None:
    whole = replace(slice_spec(memory_mib=81920, core_pct=100), exclusive=True)
    assert pinned_env(BASE, whole, Isolation(ProviderName.MPS)) == {
        "PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": GPU}
    with pytest.raises(ProviderError, match="needs HAMi-core's library"):
        pinned_env(BASE, slice_spec(), Isolation(ProviderName.HAMI_CORE))


HEAD = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"


def write_net(root: Path, tcp: list[str], tcp6: list[str]) -> Path:
    root.mkdir(exist_ok=True)
    (root / "tcp").write_text(HEAD + "".join(f"   0: {a} 00000000:0000 {st} x\n"
                                             for a, st in (x.split() for x in tcp)))
    (root / "tcp6").write_text(HEAD + "".join(
        f"   0: {a} 00000000000000000000000000000000:0000 {st} x\n"
        for a, st in (x.split() for x in tcp6)))
    return root


def test_a_provider_listening_beyond_loopback_is_found(tmp_path: Path) -> None:
    port = "39E1"  # 14817
    loopback = write_net(tmp_path / "a", [f"0100007F:{port} 0A"],
                         [f"00000000000000000000000001000000:{port} 0A"])
    assert exposure(14817, loopback) == []
    everywhere = write_net(tmp_path / "b", [f"00000000:{port} 0A", f"0100007F:{port} 01"],
                           [f"00000000000000000000000000000000:{port} 0A"])
    assert exposure(14817, everywhere) == ["0.0.0.0", "::"]
    pod_ip = write_net(tmp_path / "c", [f"0300000A:{port} 0A"], [])
    assert exposure(14817, pod_ip) == ["10.0.0.3"]
    assert exposure(14818, everywhere) == []
    assert exposure(14817, tmp_path / "missing") == []


def test_the_real_proc_net_sees_a_socket_bound_everywhere() -> None:
    with socket.create_server(("0.0.0.0", 0)) as s:
        port = s.getsockname()[1]
        assert "0.0.0.0" in exposure(port)
    with socket.create_server(("127.0.0.1", 0)) as s:
        assert exposure(s.getsockname()[1]) == []


ROUTES: dict[str, status.Route] = {"/ready": lambda: (503, {"state": "lost"})}


@pytest.mark.parametrize(("head", "code"), [
    (b"GET /ready HTTP/1.1\r\nHost: x\r\n\r\n", 503),
    (b"GET /ready?x=1 HTTP/1.0\r\n\r\n", 503),
    (b"GET /nope HTTP/1.1\r\n\r\n", 404),
    (b"POST /ready HTTP/1.1\r\n\r\n", 405),
    (b"\x16\x03\x01garbage\r\n\r\n", 400),
])
def test_the_status_endpoint_answers_get_only_with_json(head: bytes, code: int) -> None:
    answer = status.respond(ROUTES, head)
    assert answer.startswith(f"HTTP/1.1 {code} ".encode())
    json.loads(answer.split(b"\r\n\r\n", 1)[1])


def test_the_status_endpoint_survives_an_endless_request_head() -> None:
    with loop_thread() as loop:
        server = loop.run(status.serve("127.0.0.1", 0, ROUTES))
        port = server.sockets[0].getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /" + b"a" * 20000)
            assert s.recv(100).startswith(b"HTTP/1.1 400 ")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /ready HTTP/1.1\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.1 503 ")
