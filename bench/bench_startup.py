"""CPU time ``gpupool`` takes to start: ``--help`` and errors found before any work.

    .venv/bin/python bench/bench_startup.py [--tries 5] [--before REV]

Runs each command ``--tries`` times as a process, from two copies of the source: BEFORE,
``git archive`` of ``--before`` (default: the commit before the command line imported only
the module of the command being run), and AFTER, this working tree; both with the same
interpreter and installed libraries, one after the other, in this one run. Prints per
command the median CPU time (user + system, ``resource.getrusage`` of the finished child)
before and after and their ratio. CPU time, not wall time, so a busy machine changes the
figures less; the first try of each also warms the file cache.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMANDS: tuple[tuple[str, ...], ...] = (
    ("--help",),
    ("simulate", "--policy", "bestfit"),
    ("simulate", "--nodes", "absent.csv", "--pods", "absent.csv"),
    ("controller", "--once", "--kubeconfig", "absent.yaml"),
    ("inspect", "--nodes", "absent.yaml", "--pod", "absent.yaml"),
)
"""``--help`` and four errors that need no heavy library: a misspelt policy, a missing
file, a missing kubeconfig, a missing cluster file."""
ENTRY = "import sys; from gpupool.cli.main import main; sys.exit(main())"


def lazy_start() -> str:
    """The first commit whose command line built only the chosen command's parser."""
    found = subprocess.run(["git", "log", "--format=%H", "-S", "COMMANDS: dict[str, str]",
                            "--", "src/gpupool/cli/main.py"], cwd=REPO, check=True,
                           capture_output=True, text=True).stdout.split()
    if not found:
        raise SystemExit("bench_startup: no commit adds COMMANDS to cli/main.py; give --before")
    return found[-1]


def checkout(rev: str, into: Path) -> Path:
    """``src/`` of ``rev``, unpacked into ``into``."""
    data = subprocess.run(["git", "archive", rev, "src"], cwd=REPO, check=True,
                          capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def cpu_seconds(src: Path, argv: tuple[str, ...], cwd: Path) -> float:
    """CPU time of one ``gpupool *argv`` process importing gpupool from ``src``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", ENTRY, *argv], cwd=cwd, env={"PYTHONPATH": str(src),
                   "PATH": "/usr/bin:/bin", "HOME": str(cwd)}, capture_output=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def median(src: Path, argv: tuple[str, ...], tries: int, cwd: Path) -> float:
    return statistics.median(cpu_seconds(src, argv, cwd) for _ in range(tries))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tries", type=int, default=5)
    parser.add_argument("--before", help="the revision to compare with (default: the commit "
                                         "before lazy start-up)")
    args = parser.parse_args()
    before_rev = args.before or f"{lazy_start()}^"
    with tempfile.TemporaryDirectory() as tmp:
        before = checkout(before_rev, Path(tmp) / "before")
        work = Path(tmp) / "work"
        work.mkdir()
        print(f"before: {before_rev}; after: this working tree; median of {args.tries} "
              f"tries; CPU seconds (user + system)")
        print(f"{'command':<58} {'before':>7} {'after':>7} {'ratio':>6}")
        for argv in COMMANDS:
            old = median(before, argv, args.tries, work)
            new = median(REPO / "src", argv, args.tries, work)
            print(f"gpupool {' '.join(argv):<50} {old:7.3f} {new:7.3f} {old / new:5.1f}x")


if __name__ == "__main__":
    main()
