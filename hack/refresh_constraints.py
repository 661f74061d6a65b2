#!/usr/bin/env python3
"""Refresh constraints.txt: resolve gpupool's dependencies afresh and keep them if they pass.

    python hack/refresh_constraints.py              # resolve, test, rewrite on success
    python hack/refresh_constraints.py --no-tests   # resolve and rewrite (review the diff!)

A new virtual environment (in a temporary folder) installs ``.[dev]`` with no constraints,
so pip takes the newest releases that pyproject.toml's bounds allow; the whole test suite
runs in it; only when it passes is constraints.txt rewritten from what was installed
(``pip freeze``). Commit the new file on its own, so that a dependency's change is one
reviewable diff. Needs the package index the README's install uses.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints.txt"
PIP = "26.3"
"""The pip the constraints name (``pip install -c constraints.txt 'pip'`` takes it)."""


def header() -> list[str]:
    """The comment lines at the top of constraints.txt, kept as they are."""
    lines = CONSTRAINTS.read_text().splitlines() if CONSTRAINTS.exists() else []
    return [line for line in lines if line.startswith("#")]


def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, text=True, **kwargs)  # type: ignore[call-overload]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-tests", action="store_true",
                        help="rewrite without running the test suite first")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpupool-constraints-") as tmp:
        venv = Path(tmp) / "venv"
        run([sys.executable, "-m", "venv", str(venv)])
        python = str(venv / "bin" / "python")
        run([python, "-m", "pip", "install", "--quiet", f"pip=={PIP}"])
        run([python, "-m", "pip", "install", "--quiet", "-e", f"{ROOT}[dev]"])
        if not args.no_tests:
            tests = subprocess.run([python, "-m", "pytest", "-x", "-q"], cwd=ROOT)
            if tests.returncode != 0:
                print("refresh_constraints: the suite fails with the new releases; "
                      "constraints.txt left as it was", file=sys.stderr)
                return 1
        frozen = run([python, "-m", "pip", "freeze", "--all", "--exclude-editable"],
                     capture_output=True).stdout.splitlines()
    pins = sorted((line for line in frozen if line and not line.startswith("#")
                   and not line.lower().startswith("gpupool")), key=str.lower)
    CONSTRAINTS.write_text("\n".join([*header(), *pins]) + "\n")
    print(f"refresh_constraints: wrote {len(pins)} pins to {CONSTRAINTS.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
