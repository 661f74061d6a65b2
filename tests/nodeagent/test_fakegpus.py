"""The FAKE GPU backend: file format, validation, fault injection."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from gpupool.core.errors import InvalidInput
from gpupool.nodeagent.fakegpus import FakeGpuBackend
from gpupool.nodeagent.gpu import GpuInfo

from .builders import uuid_of, write_gpus


def test_the_file_describes_models_memory_numa_and_labels(tmp_path: Path) -> None:
    gpus = FakeGpuBackend(write_gpus(tmp_path / "g.yaml", 4)).discover()
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert [g.numa_node for g in gpus] == [0, 0, 1, 1]
    assert gpus[3] == GpuInfo(uuid_of(3), 3, "A100-SXM4-80GB", 16384, 1, "ampere", True, "",
                              (("nvlink", "true"),))
    assert gpus[0].to_core().label_map()["nvlink"] == "true"


@pytest.mark.parametrize("text, message", [
    ("gpus: 3", "g.yaml:1:7: gpus: expected a list, got a whole number '3'"),
    ("gpus: [{model: x, memoryMiB: 1}]", r"gpus\[0\]: missing required key 'uuid'"),
    ("gpus: [{uuid: a, memoryMiB: 0}]", "memoryMiB must be positive"),
    ("gpus: [{uuid: a, memoryMiB: 10, health: Sick}]", "health must be Healthy or Unhealthy"),
    ("gpus: [{uuid: a, memoryMiB: 10}, {uuid: a, memoryMiB: 10}]", "must be unique"),
    ("gpus: [{uuid: a, memoryMiB: 10, numaNode: -1}]", "numaNode must be a whole number"),
    ("gpus: [{uuid: a, memoryMiB: 10, index: 2}]", "indexes must be 0..n-1"),
    ("gpus: [unclosed", "g.yaml:1:16: not valid YAML"),
])
def test_a_bad_file_is_refused_with_the_reason(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(text)
    with pytest.raises(InvalidInput, match=message):
        FakeGpuBackend(path)


def test_a_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="cannot read fake GPU file"):
        FakeGpuBackend(tmp_path / "absent.yaml")


def test_injected_faults_are_written_to_the_file_and_reported(tmp_path: Path) -> None:
    path = write_gpus(tmp_path / "g.yaml", 2)
    backend = FakeGpuBackend(path)
    seen: list[tuple[GpuInfo, ...]] = []
    backend.watch(seen.append)
    try:
        backend.set_health(uuid_of(1), False, "XID 79")
        assert not seen[-1][1].healthy and seen[-1][1].reason == "XID 79"
        assert not FakeGpuBackend(path).discover()[1].healthy  # the file says so too
        backend.set_present(uuid_of(0), False)
        assert [g.uuid for g in seen[-1]] == [uuid_of(1)]
        with pytest.raises(InvalidInput, match="no GPU GPU-x"):
            backend.set_health("GPU-x", False)
    finally:
        backend.close()


def test_a_bad_edit_of_the_file_is_ignored_and_the_last_good_state_kept(tmp_path: Path) -> None:
    path = write_gpus(tmp_path / "g.yaml", 2)
    backend = FakeGpuBackend(path, poll_s=0.01)
    changed = threading.Event()
    backend.watch(lambda gpus: changed.set())
    try:
        path.write_text("gpus: nonsense")
        assert not changed.wait(0.2)
        assert len(backend.discover()) == 2
        path.write_text(_unhealthy_second(tmp_path))
        assert changed.wait(30)
        assert not backend.discover()[1].healthy
    finally:
        backend.close()


def _unhealthy_second(tmp_path: Path) -> str:
    text = write_gpus(tmp_path / "other.yaml", 2).read_text()
    head, _, tail = text.partition(f"- uuid: {uuid_of(1)}")
    return head + f"- uuid: {uuid_of(1)}\n  health: Unhealthy" + tail
