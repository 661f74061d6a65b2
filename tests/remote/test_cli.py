"""gpupool slice-server / slice-client / slice-stub: what a person sees when something is
wrong (one line, exit 2) and the stub run by hand."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.cli.main import main
from gpupool.remote.stubclient import StubClient
from tests.ports import free_port
from tests.waiting import wait_for

from .builders import GPU, POD_UID, Authority

SLICE = ["--pod-uid", POD_UID, "--pod-name", "default/trainer", "--container", "main",
         "--gpu-uuid", GPU, "--memory-mib", "1", "--core-pct", "10", "--host", "127.0.0.1",
         "--status-address", "127.0.0.1"]


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(args)
    return code, capsys.readouterr().err


def test_a_slice_server_whose_provider_cannot_start_says_so_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    creds = Authority(tmp_path).server()
    code, err = run(["slice-server", *SLICE, "--port", str(free_port()), "--status-port",
                     str(free_port()), "--credentials-dir", str(creds), "--provider",
                     "command", "--provider-command", "/nonexistent/lupine-server --port {port}",
                     "--loopback-port", "0"], capsys)
    assert code == 2
    assert err.splitlines()[-1] == ("gpupool: cannot start the provider "
                                    "'/nonexistent/lupine-server': No such file or directory")


@pytest.mark.parametrize(("extra", "why"), [
    (["--provider", "command"], "gpupool: --provider command needs --provider-command"),
    (["--provider-env", "NOEQUALS"], "gpupool: --provider-env takes NAME=VALUE, got 'NOEQUALS'"),
    (["--isolation-provider", "hami-core"],
     "gpupool: the hami-core isolation provider needs HAMi-core's library "
     "(--hami-core-library)"),
])
def test_a_slice_server_refuses_bad_flags_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], why: str) -> None:
    creds = Authority(tmp_path).server()
    code, err = run(["slice-server", *SLICE, "--credentials-dir", str(creds), *extra], capsys)
    assert (code, err.strip()) == (2, why)


def test_missing_credentials_are_one_line_naming_the_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["slice-client", "--pod-uid", POD_UID, "--slice-server", "127.0.0.1:1",
                     "--credentials-dir", str(tmp_path / "none"), "--status-address",
                     "127.0.0.1", "--status-port", str(free_port())], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith(f"gpupool: cannot load the certificate {tmp_path}/none/tls.crt")


def test_an_unreadable_decision_is_one_line_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["slice-client", "--pod-uid", POD_UID, "--slice-server", "127.0.0.1:1",
                     "--credentials-dir", str(tmp_path / "none"), "--status-address",
                     "127.0.0.1", "--status-port", str(free_port()), "--decision", "{"],
                    capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith(f"gpupool: --decision: pod {POD_UID}: gpupool.io/allocation is not "
                          "JSON")


def test_a_sidecar_whose_server_never_answers_gives_up_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    code, err = run(["slice-client", "--pod-uid", POD_UID, "--slice-server",
                     f"127.0.0.1:{port}", "--credentials-dir",
                     str(Authority(tmp_path).client()), "--status-address", "127.0.0.1",
                     "--status-port", str(free_port()), "--port", "0",
                     "--wait-seconds", "0.5"], capsys)
    assert code == 2
    assert err.strip().startswith(f"gpupool: slice server 127.0.0.1:{port} did not answer "
                                  "within 0.5 s: ConnectionRefusedError")


@pytest.mark.parametrize("value", ["nohost", "host:", "host:99999", ":80"])
def test_a_bad_server_address_is_refused(value: str, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    with pytest.raises(SystemExit) as done:
        main(["slice-client", "--pod-uid", POD_UID, "--slice-server", value,
              "--credentials-dir", "/x"])
    assert done.value.code == 2
    assert "expected HOST:PORT" in capsys.readouterr().err


def test_the_stub_can_be_run_by_hand(tmp_path: Path) -> None:
    port = free_port()
    stub = subprocess.Popen([sys.executable, "-m", "gpupool.cli.main", "slice-stub", "--port",
                             str(port), "--memory-limit-mib", "1"],
                            stderr=subprocess.PIPE, text=True)
    try:
        def up() -> bool:
            try:
                with StubClient("127.0.0.1", port, timeout_s=2) as c:
                    return c.hello()["memory_limit_bytes"] == 1 << 20
            except OSError:
                return False
        assert wait_for(up)
    finally:
        stub.terminate()
        stub.wait(30)
