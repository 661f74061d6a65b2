"""The direction of imports between gpupool's layers, checked on every module's source.

Rules (docs/design/groups-quota-classes.md, "Layering"):

* ``gpupool.core`` is pure: it imports nothing of gpupool outside the core, no
  Kubernetes client, HTTP, gRPC, asyncio, threads, Prometheus, process or socket
  modules, no wall clock (``time``; ``.now()``/``.utcnow()``/``.today()``) and no
  global random (only ``random.Random`` — instances are passed in — and never
  ``numpy.random``, ``secrets`` or ``uuid``).
* ``gpupool.contract`` imports only the core, itself, ``json`` and pure-language
  standard modules (typing, dataclasses, enum, re, datetime for parsing …), with
  the same clock and random rules.
* The adapters ``gpupool.extender``, ``gpupool.nodeagent``, ``gpupool.controller``,
  ``gpupool.sim``, ``gpupool.webhook`` and ``gpupool.remote`` do not import each other,
  nor the CLI.
* ``gpupool.http`` (the HTTP/1.1 edge the extender and the webhook share: framing,
  connection rules, uvicorn's configuration) sits below the adapters, beside
  ``gpupool.kube``: it imports only the core and the contract of gpupool, and neither
  ``gpupool.kube`` nor anything below it (security, the contract, the core) imports it.
* Only ``gpupool.kube`` imports ``lightkube`` or ``kubernetes``.
* No product module imports ``gpupool_testing`` (the test fakes, never installed).
* ``gpupool.security`` (decision signatures, certificates: pure cryptography) imports
  only the core, the contract and itself besides ``cryptography`` and the standard
  library; it does no I/O, so the core's clock and random rules apply too.
* Inside ``gpupool.extender`` the rooms point downwards (``EXTENDER_ROOMS``, top first:
  a room imports only rooms of a later rank, rooms of one rank not each other) and no
  module imports, directly or round about, a module that imports it.

The checker reads source with ``ast`` (so it sees every module, imported or not,
including imports inside functions and ``importlib.import_module("…")`` with a
literal name); ``.importlinter`` states the same layers for ``lint-imports``,
which is run too when it is installed.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
ROOT = "gpupool"
ADAPTERS = ("extender", "nodeagent", "controller", "sim", "webhook", "remote")
BELOW_HTTP = ("kube", "security", "contract", "core")

CORE_FORBIDDEN = {
    "lightkube": "a Kubernetes client",
    "kubernetes": "a Kubernetes client",
    "httpx": "HTTP",
    "starlette": "HTTP",
    "uvicorn": "HTTP",
    "http": "HTTP",
    "urllib.request": "HTTP",
    "requests": "HTTP",
    "grpc": "gRPC",
    "asyncio": "asyncio",
    "threading": "threads",
    "concurrent": "threads",
    "multiprocessing": "processes",
    "subprocess": "processes",
    "socket": "network",
    "prometheus_client": "Prometheus",
    "time": "the wall clock",
    "numpy.random": "global random",
    "secrets": "global random",
    "uuid": "global random (uuid4) and the clock (uuid1)",
}
CONTRACT_STDLIB = frozenset({
    "__future__", "json", "typing", "dataclasses", "collections", "enum", "re", "datetime",
    "functools", "itertools", "math", "fractions", "string", "difflib",
})
SECURITY_FORBIDDEN = {k.split(".")[0]: v for k, v in CORE_FORBIDDEN.items()
                      if k not in ("time", "secrets", "uuid")}
CLOCK_CALLS = frozenset({"now", "utcnow", "today"})
EXTENDER = f"{ROOT}.extender"
EXTENDER_ROOMS: tuple[frozenset[str], ...] = tuple(frozenset(rank.split()) for rank in (
    "edge", "service", "bind preemption dra", "tenancy", "state", "wire", "metrics workload"))
"""The extender's rooms (subpackages, or modules beside them), top first
(docs/architecture.md, "The extender's rooms")."""


@dataclass(frozen=True, slots=True)
class Violation:
    module: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line}: {self.message}"


# -- reading modules ---------------------------------------------------------------------


def modules(src: Path, root: str) -> Iterator[tuple[str, Path]]:
    """(dotted name, path) of every module of package ``root`` under ``src``."""
    for path in sorted((src / root).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


def imported(module: str, is_package: bool, tree: ast.AST) -> Iterator[tuple[str, int]]:
    """(imported module, line) for each import; ``from a import b`` yields a and a.b."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(package, node.module, node.level)
            yield base, node.lineno
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno
        elif isinstance(node, ast.Call) and _is_dynamic_import(node):
            arg = node.args[0]
            assert isinstance(arg, ast.Constant)
            yield str(arg.value), node.lineno


def _absolute(package: str, name: str | None, level: int) -> str:
    if level == 0:
        return name or ""
    parts = package.split(".")
    base = parts[: len(parts) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _is_dynamic_import(node: ast.Call) -> bool:
    f = node.func
    named = (isinstance(f, ast.Attribute) and f.attr == "import_module") or (
        isinstance(f, ast.Name) and f.id in ("import_module", "__import__"))
    return named and bool(node.args) and isinstance(node.args[0], ast.Constant) and isinstance(
        node.args[0].value, str)


# -- the rules ----------------------------------------------------------------------------


def layer(module: str, root: str = ROOT) -> str | None:
    """``core``, ``contract``, ``sim``, … for modules of ``root``; None outside it."""
    if module != root and not module.startswith(root + "."):
        return None
    rest = module[len(root) + 1 :]
    return rest.split(".")[0] if rest else ""


def _within(target: str, prefix: str) -> bool:
    return target == prefix or target.startswith(prefix + ".")


def import_violation(importer: str, target: str, root: str = ROOT) -> str | None:
    """Why ``importer`` may not import ``target``, or None."""
    mine, theirs = layer(importer, root), layer(target, root)
    top = target.split(".")[0]
    if top in ("lightkube", "kubernetes") and mine != "kube":
        return f"imports {target}: only {root}.kube talks to the Kubernetes API"
    if top == "gpupool_testing":
        return f"imports {target}: test fakes (gpupool_testing) are not part of the product"
    if mine == "security" and theirs not in (None, "", "core", "contract", "security"):
        return f"imports {target}: security imports only the core and the contract of {root}"
    if mine == "security" and theirs is None and top in SECURITY_FORBIDDEN:
        return f"imports {target}: security does no I/O ({SECURITY_FORBIDDEN[top]})"
    if mine == "core":
        if theirs not in (None, "", "core"):
            return f"imports {target}: the core imports nothing of {root} outside the core"
        for prefix, what in CORE_FORBIDDEN.items():
            if _within(target, prefix):
                return f"imports {target}: the core is pure ({what} is not allowed)"
    if mine == "contract":
        ok = theirs in ("", "core", "contract") or (theirs is None and top in CONTRACT_STDLIB)
        if not ok:
            return f"imports {target}: the contract imports only the core, json and pure stdlib"
    if mine == "http" and theirs not in (None, "", "core", "contract", "http"):
        return f"imports {target}: the HTTP edge imports only the core and the contract of {root}"
    if mine in BELOW_HTTP and theirs == "http":
        return f"imports {target}: the HTTP edge is above {root}.{mine}"
    if mine in ADAPTERS and theirs is not None and theirs != mine and theirs in (*ADAPTERS, "cli"):
        return f"imports {target}: adapters do not import each other or the CLI"
    return None


def clock_and_random(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Wall-clock calls and global-random use in a module (for the pure layers)."""
    random_names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            random_names |= {a.asname or a.name for a in node.names if a.name == "random"}
        elif isinstance(node, ast.ImportFrom) and node.module == "random" and node.level == 0:
            for a in node.names:
                if a.name != "Random":
                    yield node.lineno, f"imports random.{a.name}: pass a random.Random instead"
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        if node.attr in CLOCK_CALLS:
            yield node.lineno, f"reads the wall clock (.{node.attr}): pass the time in"
        if (isinstance(node.value, ast.Name) and node.value.id in random_names
                and node.attr != "Random"):
            yield node.lineno, f"uses global random.{node.attr}: pass a random.Random instead"
        if node.attr == "random" and isinstance(node.value, ast.Name) and node.value.id in (
                "np", "numpy"):
            yield node.lineno, "uses numpy's global random: pass a seeded generator instead"


def violations(src: Path, root: str = ROOT) -> list[Violation]:
    """Every layering violation in package ``root`` under ``src``."""
    found: list[Violation] = []
    for module, path in modules(src, root):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        is_package = path.name == "__init__.py"
        for target, line in imported(module, is_package, tree):
            why = import_violation(module, target, root)
            if why:
                found.append(Violation(module, line, why))
        if layer(module, root) in ("core", "contract", "security"):
            found += [Violation(module, line, why) for line, why in clock_and_random(tree)]
    return sorted(set(found), key=lambda v: (v.module, v.line, v.message))


# -- the extender's rooms -----------------------------------------------------------------


def module_graph(src: Path, package: str) -> dict[str, set[str]]:
    """Every module of ``package`` -> the modules of ``package`` it imports (at any depth
    of its source: in functions and under ``TYPE_CHECKING`` too)."""
    root, _, _ = package.partition(".")
    found = dict(modules(src, root))
    names = {m for m in found if _within(m, package)}
    graph: dict[str, set[str]] = {}
    for module in sorted(names):
        path = found[module]
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        targets = set()
        for target, _ in imported(module, path.name == "__init__.py", tree):
            while target and target not in names:
                target = target.rpartition(".")[0]
            if target and target != module:
                targets.add(target)
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (``a -> b -> ... -> a``) per group of modules that import each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(_cycle_through(graph, set(group), min(group)))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _cycle_through(graph: dict[str, set[str]], group: set[str], start: str) -> list[str]:
    """A shortest path from ``start`` back to itself inside ``group``."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        after = []
        for node in frontier:
            for nxt in sorted(graph[node] & group):
                if nxt == start:
                    return paths[node] + [start]
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    after.append(nxt)
        frontier = after
    raise AssertionError(f"{start} is in no cycle")


def room_rank(module: str) -> tuple[str, int] | None:
    """The extender room of ``module`` and its rank (0 = top); None for the package."""
    rest = module[len(EXTENDER) + 1:].split(".")[0] if module != EXTENDER else ""
    for rank, rooms in enumerate(EXTENDER_ROOMS):
        if rest in rooms:
            return rest, rank
    return None


def room_violations(src: Path) -> list[str]:
    """Imports between the extender's modules that point to a room above or beside their
    own, modules outside every room, and import cycles."""
    graph = module_graph(src, EXTENDER)
    found = []
    for module, targets in sorted(graph.items()):
        mine = room_rank(module)
        if mine is None:
            if module != EXTENDER:
                found.append(f"{module}: in no room of EXTENDER_ROOMS")
            continue
        for target in sorted(targets):
            theirs = room_rank(target)
            if theirs is None or theirs[0] == mine[0]:
                continue
            if theirs[1] <= mine[1]:
                where = "beside" if theirs[1] == mine[1] else "above"
                found.append(f"{module} imports {target}: room {theirs[0]} is {where} "
                             f"room {mine[0]}")
    found += ["import cycle: " + " -> ".join(c) for c in cycles(graph)]
    return found


# -- tests ----------------------------------------------------------------------------------


def test_gpupool_imports_point_only_downwards() -> None:
    found = violations(SRC)
    assert not found, "layering violations:\n" + "\n".join(map(str, found))


def test_the_extender_rooms_point_downwards_without_cycles() -> None:
    found = room_violations(SRC)
    assert not found, "extender room violations:\n" + "\n".join(found)
    rooms = {r[0] for m in module_graph(SRC, EXTENDER) if (r := room_rank(m)) is not None}
    assert rooms == set().union(*EXTENDER_ROOMS)


ROOM_BAD = [
    ({"state/a.py": "from gpupool.extender.bind import b", "bind/b.py": ""},
     "room bind is above room state"),
    ({"bind/a.py": "def f():\n    from gpupool.extender.dra.b import X", "dra/b.py": "X = 1"},
     "room dra is beside room bind"),
    ({"wire/a.py": "from gpupool.extender import service", "service.py": ""},
     "room service is above room wire"),
    ({"state/a.py": "from gpupool.extender.state import b", "state/b.py":
      "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A"},
     "import cycle: gpupool.extender.state.a -> gpupool.extender.state.b -> "
     "gpupool.extender.state.a"),
    ({"dra/a.py": "import gpupool.extender.dra.b", "dra/b.py": "import gpupool.extender.dra.c",
      "dra/c.py": "from gpupool.extender.dra.a import X"}, "import cycle"),
    ({"lobby/a.py": ""}, "in no room"),
]


def _extender(tmp: Path, files: dict[str, str]) -> Path:
    for relpath, source in files.items():
        src = _package(tmp, f"extender/{relpath}", source)
        for parent in Path(relpath).parents:
            init = src / ROOT / "extender" / parent / "__init__.py"
            if not init.exists():
                init.write_text("", encoding="utf-8")
    return tmp / "src"


@pytest.mark.parametrize(("files", "expected"), ROOM_BAD, ids=[e for _, e in ROOM_BAD])
def test_the_room_checker_fails_on_a_violation(tmp_path: Path, files: dict[str, str],
                                               expected: str) -> None:
    found = room_violations(_extender(tmp_path, files))
    assert any(expected in v for v in found), found


def test_the_room_checker_accepts_imports_downwards_and_within_a_room(tmp_path: Path) -> None:
    src = _extender(tmp_path, {
        "edge/a.py": "from gpupool.extender import service", "service.py":
        "from gpupool.extender.bind import b\nfrom gpupool.extender.dra.c import X",
        "bind/b.py": "from gpupool.extender.bind.d import Y\nfrom gpupool.extender.state import e",
        "bind/d.py": "Y = 1", "dra/c.py": "from gpupool.extender.wire.f import Z\nX = 1",
        "state/e.py": "from gpupool.extender import metrics", "wire/f.py": "Z = 1",
        "metrics.py": ""})
    assert room_violations(src) == []


def test_the_checker_reads_every_module_of_every_layer() -> None:
    names = [m for m, _ in modules(SRC, ROOT)]
    assert f"{ROOT}.core.state" in names and f"{ROOT}.contract.annotations" in names
    assert len(names) == len(list((SRC / ROOT).rglob("*.py")))


BAD = [
    ("core/a.py", "import lightkube", "Kubernetes API"),
    ("core/a.py", "import kubernetes.client", "Kubernetes API"),
    ("core/a.py", "import httpx", "HTTP"),
    ("core/a.py", "from starlette.applications import Starlette", "HTTP"),
    ("core/a.py", "import uvicorn", "HTTP"),
    ("core/a.py", "import http.client", "HTTP"),
    ("core/a.py", "from urllib.request import urlopen", "HTTP"),
    ("core/a.py", "from urllib import request", "HTTP"),
    ("core/a.py", "import requests", "HTTP"),
    ("core/a.py", "import grpc", "gRPC"),
    ("core/a.py", "import asyncio", "asyncio"),
    ("core/a.py", "def f():\n    import threading", "threads"),
    ("core/a.py", "import prometheus_client", "Prometheus"),
    ("core/a.py", "import time", "wall clock"),
    ("core/a.py", "from time import monotonic", "wall clock"),
    ("core/a.py", "from datetime import datetime\nNOW = datetime.now()", "wall clock"),
    ("core/a.py", "import datetime\nT = datetime.date.today()", "wall clock"),
    ("core/a.py", "import random\nX = random.random()", "global random"),
    ("core/a.py", "import random as r\nX = r.choice([1, 2])", "global random"),
    ("core/a.py", "from random import shuffle", "random.Random"),
    ("core/a.py", "import numpy as np\nX = np.random.rand(3)", "numpy's global random"),
    ("core/a.py", "from numpy.random import default_rng", "global random"),
    ("core/a.py", "import importlib\nM = importlib.import_module('asyncio')", "asyncio"),
    ("core/a.py", "from gpupool.contract import names", "outside the core"),
    ("core/sub/a.py", "from ...contract import names", "outside the core"),
    ("core/a.py", "from .. import sim", "outside the core"),
    ("contract/a.py", "import yaml", "only the core"),
    ("contract/a.py", "import numpy", "only the core"),
    ("contract/a.py", "from gpupool.extender import cache", "only the core"),
    ("contract/a.py", "from datetime import datetime\nT = datetime.utcnow()", "wall clock"),
    ("sim/a.py", "from gpupool.extender import cache", "adapters do not import each other"),
    ("extender/a.py", "import gpupool.nodeagent.plugin", "adapters do not import each other"),
    ("nodeagent/a.py", "from gpupool import controller", "adapters do not import each other"),
    ("controller/a.py", "from gpupool.cli import main", "adapters do not import each other"),
    ("extender/a.py", "import lightkube", "Kubernetes API"),
    ("cli/a.py", "from lightkube import Client", "Kubernetes API"),
    ("kube/a.py", "from gpupool_testing.fake_apiserver import FakeApiServer", "test fakes"),
    ("extender/a.py", "import gpupool_testing", "test fakes"),
    ("security/a.py", "from gpupool.kube import api", "only the core and the contract"),
    ("security/a.py", "import httpx", "no I/O"),
    ("security/a.py", "from datetime import datetime\nT = datetime.now()", "wall clock"),
    ("webhook/a.py", "from gpupool.extender import cache", "adapters do not import each other"),
    ("remote/a.py", "from gpupool.nodeagent import monitor", "adapters do not import each other"),
    ("http/a.py", "from gpupool.extender.edge import sizing", "only the core and the contract"),
    ("http/a.py", "from gpupool.webhook import server", "only the core and the contract"),
    ("http/a.py", "from gpupool.kube import tlsstore", "only the core and the contract"),
    ("kube/a.py", "from gpupool.http import framing", "the HTTP edge is above"),
    ("security/a.py", "from gpupool.http import framing", "only the core and the contract"),
]

GOOD = [
    ("core/a.py", "import random\ndef f(rng: random.Random) -> int:\n    return rng.randrange(3)"),
    ("core/a.py", "from random import Random"),
    ("core/a.py", "import numpy as np\nA = np.zeros(3)"),
    ("core/a.py", "from urllib.parse import quote"),
    ("core/a.py", "from datetime import datetime\nT = datetime.fromisoformat('2024-01-01')"),
    ("core/a.py", "from gpupool.core.model import Gpu\nfrom . import b"),
    ("contract/a.py", "import json\nfrom gpupool.core.allocation import Allocation"),
    ("sim/a.py", "from gpupool.core.placement import Placer\nfrom gpupool.contract import names"),
    ("extender/a.py", "from gpupool.kube import client\nimport starlette"),
    ("kube/a.py", "import lightkube"),
    ("cli/a.py", "from gpupool.sim import trace\nfrom gpupool.extender import app"),
    ("security/a.py", "from cryptography.hazmat.primitives.asymmetric import ed25519"),
    ("extender/a.py", "from gpupool.security import signing"),
    ("webhook/a.py", "from gpupool.http.connections import ConnectionRules"),
    ("extender/edge/a.py", "from gpupool.http import framing, serving"),
    ("http/a.py", "from gpupool.contract import jsondepth\nimport uvicorn"),
]


def _package(tmp: Path, relpath: str, source: str) -> Path:
    src = tmp / "src"
    target = src / ROOT / relpath
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(source + "\n", encoding="utf-8")
    return src


@pytest.mark.parametrize(("relpath", "source", "expected"), BAD,
                         ids=[f"{p}: {s.splitlines()[-1]}" for p, s, _ in BAD])
def test_the_checker_fails_on_a_violation(tmp_path: Path, relpath: str, source: str,
                                          expected: str) -> None:
    found = violations(_package(tmp_path, relpath, source))
    assert found, f"{relpath} with {source!r} was not flagged"
    assert any(expected in v.message for v in found), [str(v) for v in found]


@pytest.mark.parametrize(("relpath", "source"), GOOD,
                         ids=[f"{p}: {s.splitlines()[0]}" for p, s in GOOD])
def test_the_checker_accepts_allowed_imports(tmp_path: Path, relpath: str, source: str) -> None:
    assert violations(_package(tmp_path, relpath, source)) == []


# -- import-linter -----------------------------------------------------------------------------


def _lint_imports() -> str | None:
    exe = Path(sys.executable).parent / "lint-imports"
    return str(exe) if exe.exists() else shutil.which("lint-imports")


def _run_lint(config: Path, cwd: Path, pythonpath: Path) -> subprocess.CompletedProcess[str]:
    exe = _lint_imports()
    if exe is None:
        pytest.skip("import-linter (lint-imports) is not installed")
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run([exe, "--config", str(config), "--no-cache", "--no-logo"], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=120, check=False)


def test_import_linter_contracts_are_kept() -> None:
    result = _run_lint(REPO / ".importlinter", REPO, SRC)
    assert result.returncode == 0, result.stdout + result.stderr


def test_import_linter_contracts_break_on_a_violation(tmp_path: Path) -> None:
    src = _package(tmp_path, "core/__init__.py", "import asyncio")
    for pkg in ("", "cli", "contract", "extender", "sim"):
        init = src / ROOT / pkg / "__init__.py"
        if not init.exists():
            init.parent.mkdir(parents=True, exist_ok=True)
            init.write_text("", encoding="utf-8")
    (src / ROOT / "sim" / "a.py").write_text("from gpupool.extender import b\n", encoding="utf-8")
    (src / ROOT / "extender" / "b.py").write_text("", encoding="utf-8")
    result = _run_lint(REPO / ".importlinter", tmp_path, src)
    assert result.returncode != 0, result.stdout
    assert "asyncio" in result.stdout and "gpupool.extender" in result.stdout, result.stdout


def test_import_linter_room_contracts_break_on_a_violation(tmp_path: Path) -> None:
    src = _extender(tmp_path, {"state/a.py": "from gpupool.extender.bind import b",
                               "bind/b.py": "import gpupool.extender.bind.c",
                               "bind/c.py": "import gpupool.extender.bind.b"})
    for pkg in ("", "cli", "contract", "core"):
        (src / ROOT / pkg).mkdir(exist_ok=True)
        (src / ROOT / pkg / "__init__.py").write_text("", encoding="utf-8")
    result = _run_lint(REPO / ".importlinter", tmp_path, src)
    assert result.returncode != 0, result.stdout
    broken = [line for line in result.stdout.splitlines() if "BROKEN" in line]
    assert len(broken) == 2, result.stdout
    assert "gpupool.extender.state.a -> gpupool.extender.bind.b" in result.stdout, result.stdout
