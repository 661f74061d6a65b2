"""``gpupool webhook``'s port sizes as flags: the defaults are the port's documented
sizes; a value out of range is one line naming the flag and its bounds, said before the
server's modules load; a budget smaller than one body is refused."""

from __future__ import annotations

import pytest

from gpupool.cli.main import build_parser, main
from gpupool.cli.webhook import sizes_of
from gpupool.webhook.sizes import Sizes


def test_the_flags_default_to_the_ports_sizes() -> None:
    args = build_parser().parse_args(["webhook"])
    assert sizes_of(args) == Sizes()


def test_each_flag_sets_its_size() -> None:
    args = build_parser().parse_args([
        "webhook", "--max-header-kib", "8", "--request-seconds", "4", "--idle-seconds", "9",
        "--max-connections", "100", "--max-body-mib", "2", "--body-budget-mib", "6",
        "--handshake-seconds", "3", "--max-handshakes", "16"])
    assert sizes_of(args) == Sizes(header_bytes=8 * 1024, read_s=4.0, idle_s=9.0,
                                   max_connections=100, max_body_bytes=2 * 1024 * 1024,
                                   body_budget_bytes=6 * 1024 * 1024, handshake_s=3.0,
                                   max_handshakes=16)


@pytest.mark.parametrize("argv", [["--max-connections", "0"], ["--request-seconds", "0"],
                                  ["--max-header-kib", "x"], ["--max-handshakes", "-1"],
                                  ["--handshake-seconds", "1000"]])
def test_a_size_out_of_range_is_one_line_naming_the_flag(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["webhook", *argv])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and argv[0] in err, err


def test_a_budget_below_one_body_is_refused_naming_both(
        capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["webhook", "--max-body-mib", "8",
                                      "--body-budget-mib", "4"])
    with pytest.raises(SystemExit) as done:
        sizes_of(args)
    assert "--body-budget-mib" in str(done.value) and "--max-body-mib" in str(done.value)
