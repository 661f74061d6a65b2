"""The product's wheel holds the product only: the test fakes (``gpupool_testing``, the fake
API server) are neither in it nor importable where it is installed.

The wheel is built offline from a copy of the sources (the build backend already in the
environment, no build isolation, no index), so the checkout is left as it was.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

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
