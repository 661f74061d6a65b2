"""The product's wheel holds the product only: the test fakes (``gpupool_testing``, the fake
API server) are neither in it nor importable where it is installed. constraints.txt pins
every package the install needs, and a fresh environment installed with it imports every
module.

The wheel is built offline from a copy of the sources (the build backend already in the
environment, no build isolation, no index), so the checkout is left as it was.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"))
    out = tmp / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--no-index", "--quiet", "--wheel-dir", str(out), str(source)],
                   check=True, capture_output=True, timeout=300)
    [built] = out.glob("gpupool-*.whl")
    return built


def test_the_wheel_holds_the_product_and_no_test_fakes(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "gpupool/kube/api.py" in names and "gpupool/cli/main.py" in names
    assert {n.split("/")[0] for n in names} == {"gpupool", wheel.name.split("-py3")[0] +
                                                ".dist-info"}
    assert [n for n in names if "gpupool_testing" in n or n.startswith("gpupool/kube/fake_")
            or "fake_apiserver" in n or "fake_store" in n] == []


def test_the_fake_api_server_is_not_importable_where_the_wheel_is_installed(
        wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                    "--quiet", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    probe = ("import importlib.util, sys; sys.path.insert(0, sys.argv[1]); "
             "import gpupool.kube.api; "
             "print(gpupool.kube.api.__file__); "
             "print(importlib.util.find_spec('gpupool_testing')); "
             "print(importlib.util.find_spec('gpupool.kube.fake_apiserver'))")
    out = subprocess.run([sys.executable, "-I", "-c", probe, str(target)], check=True,
                         capture_output=True, text=True, timeout=120, cwd=tmp_path).stdout
    where, testing, fake = out.splitlines()
    assert where.startswith(str(target))  # the installed wheel's product was imported
    assert (testing, fake) == ("None", "None")


# -- the pinned install --------------------------------------------------------------------------
CONSTRAINTS = ROOT / "constraints.txt"


def pins() -> dict[str, str]:
    """constraints.txt as {normalised name: version}."""
    out = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            out[canonicalize_name(name)] = version.strip()
    return out


def required(dist: str, extras: frozenset[str] = frozenset()) -> set[str]:
    """Every distribution ``dist`` needs here, with ``extras``, recursively (by markers)."""
    seen: set[str] = set()
    todo = [(dist, extras)]
    while todo:
        name, wanted = todo.pop()
        for text in metadata.requires(name) or []:
            req = Requirement(text)
            if req.marker and not any(req.marker.evaluate({"extra": e})
                                      for e in (wanted or {""})):
                continue
            key = canonicalize_name(req.name)
            if key not in seen:
                seen.add(key)
                todo.append((req.name, frozenset(req.extras)))
    return seen


def test_every_package_the_install_needs_is_pinned_within_pyprojects_bounds() -> None:
    pinned = pins()
    needed = required("gpupool", frozenset({"dev"}))
    assert sorted(needed - pinned.keys()) == [], "refresh constraints.txt " \
        "(hack/refresh_constraints.py)"
    for text in metadata.requires("gpupool") or []:
        req = Requirement(text)
        key = canonicalize_name(req.name)
        if key in pinned:
            assert req.specifier.contains(pinned[key], prereleases=True), (text, pinned[key])


@pytest.mark.slow  # a virtual environment and an install of every runtime dependency
def test_a_fresh_environment_installs_the_pins_and_imports_every_module(
        wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    # --no-compile: byte-compiling every dependency is a third of the install's time, and
    # checks nothing that the imports below do not
    done = subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                           "--no-compile", "-c", str(CONSTRAINTS), str(wheel)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    walk = ("import importlib, pkgutil, gpupool\n"
            "names = [m.name for m in pkgutil.walk_packages(gpupool.__path__, 'gpupool.')]\n"
            "for name in names:\n"
            "    importlib.import_module(name)\n"
            "from importlib import metadata\n"
            "for d in metadata.distributions():\n"
            "    print(d.metadata['Name'], d.version)\n"
            "print(len(names), 'modules')\n")
    out = subprocess.run([python, "-I", "-c", walk], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    *dists, count = out.stdout.splitlines()
    assert int(count.split()[0]) > 100
    pinned = pins()
    installed = {canonicalize_name(line.split()[0]): line.split()[1] for line in dists}
    runtime = required("gpupool") & installed.keys()
    assert {n: installed[n] for n in runtime} == {n: pinned[n] for n in runtime}
    check = subprocess.run([python, "-m", "pip", "check"], capture_output=True, text=True,
                           timeout=300)
    assert check.returncode == 0, check.stdout
