"""Tables fit 80 columns (a pipe, or a narrow terminal): optional columns are left out and
named, no word is cut short with "…", titles wrap at the screen, not at the table; ``--wide``
prints every column."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table

from gpupool.cli.main import main
from gpupool.cli.tables import show

REPO = Path(__file__).resolve().parents[2]
TENANTS = REPO / "examples" / "tenants.yaml"
TENANT_COLUMNS = ("nominal", "pods", "queued", "wait p50/p95 s", "preempted", "reclaimed",
                  "reclaims", "fair: reclaimed/reclaims", "GPUs", "peak", "borrowed")


def printed(width: int, table: Table, **kwargs: object) -> list[str]:
    out = io.StringIO()
    show(Console(file=out, width=width, markup=False, highlight=False), table,
         **kwargs)  # type: ignore[arg-type]
    return out.getvalue().splitlines()


def wide_table() -> Table:
    table = Table(title="a title long enough to need more than the table's own width to "
                        "be printed on one line", caption="what the columns mean")
    for name in ("name", "first column", "second column", "third column", "fourth column",
                 "fifth column"):
        table.add_column(name)
    table.add_row("node-0001", "one", "two", "three", "four", "five")
    return table


def test_a_table_wider_than_the_screen_leaves_out_its_optional_columns_and_names_them(
        ) -> None:
    lines = printed(50, wide_table(), optional=("fifth column", "fourth column"),
                    more="--wide shows them")
    assert all(len(line) <= 50 for line in lines), lines
    table = "\n".join(lines[2:-3])
    assert "fifth" not in table and "fourth" in table and "node-0001" in table
    assert " ".join(" ".join(lines[-2:]).split()) == (
        "not shown at 50 columns: fifth column (--wide shows them)")
    assert not any("…" in line for line in lines)


def test_a_table_too_wide_for_whole_words_gives_each_column_its_longest_word() -> None:
    lines = printed(60, wide_table())
    assert all(len(line) <= 60 for line in lines), lines
    assert "│ node-0001 │ one" in "\n".join(lines)  # not broken: "node-0" / "001"


def test_the_title_wraps_at_the_screen_not_at_the_table() -> None:
    lines = printed(80, wide_table())
    assert lines[0] == ("a title long enough to need more than the table's own width to be "
                        "printed on one")
    assert lines[1] == "line"


def test_a_table_that_fits_keeps_every_column() -> None:
    lines = printed(200, wide_table(), optional=("fifth column",))
    assert "fifth column" in "\n".join(lines)
    assert not any(line.startswith("not shown") for line in lines)


def test_wide_prints_every_column_however_narrow_the_screen() -> None:
    lines = printed(40, wide_table(), optional=("fifth column", "fourth column"), wide=True)
    assert max(len(line) for line in lines) > 40
    assert "fifth column" in "\n".join(lines)


def test_the_tenant_tables_fit_80_columns_in_a_pipe_and_name_what_they_leave_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--mode", "timed", "--nodes", str(TENANTS), "--pods", str(TENANTS),
                 "--policy", "best-fit", "--seeds", "1", "--out", str(tmp_path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines()
             if not line.startswith("wrote ")]  # paths are never broken
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert not any("…" in line for line in lines)
    header = next(line for line in lines if line.startswith("┃") and "group" in line)
    assert sum(line.startswith("│ all groups ") for line in lines) == 3  # 3 runs, whole
    kept = [c for c in TENANT_COLUMNS if c in header]
    assert kept == ["nominal", "pods", "queued", "GPUs", "peak", "borrowed"], header
    assert (f"not shown at 80 columns: fair: reclaimed/reclaims, reclaims, reclaimed, "
            f"preempted (--wide shows them; {tmp_path}/ has every column)"
            ) in " ".join(" ".join(lines).split())


def test_the_tenant_tables_show_every_column_with_wide(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--mode", "timed", "--nodes", str(TENANTS), "--pods", str(TENANTS),
                 "--policy", "best-fit", "--seeds", "1", "--out", str(tmp_path), "--wide"]) == 0
    shown = capsys.readouterr().out
    header = next(line for line in shown.splitlines() if line.startswith("┃") and "group" in line)
    assert all(c in header for c in TENANT_COLUMNS), header
    assert "not shown" not in shown


def test_the_simulation_table_fits_80_columns_with_every_optional_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--seeds", "3", "--synthetic-nodes", "300", "--out", str(tmp_path),
                 "--policy", "best-fit", "--policy", "fgd-balance", "--workers", "1",
                 "--nodes-to-score", "0"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines()
             if not line.startswith("wrote ")]  # paths are never broken
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert not any("…" in line for line in lines)
    assert lines[0].startswith("synthetic-300: 300 nodes, ")
    assert lines[1:3] == ["protocol mode, 1 seed(s) 3", "kube-scheduler window 144 nodes"]
