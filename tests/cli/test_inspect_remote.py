"""``gpupool inspect`` / ``kubectl gpupool`` with remote GPU slices: a pod on a node without
GPUs shows where its slice is served and what its server is doing; the serving GPU lists
it as a remote slice, counted like a local one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.cli import kubectl
from gpupool.contract import annotations as records
from gpupool.contract import names
from gpupool.contract.slices import SliceState, SliceStatus
from gpupool.core.allocation import Allocation, Slice
from gpupool.security.signing import claims_of

from .test_inspect_live import KEYS, gpu_obj, node_obj, pod_obj, run_json, write_kubeconfig


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with FakeApiServer() as fake:
        for node in ("gpu-a", "cpu-a"):
            fake.seed("nodes", node_obj(node))
        fake.seed("gpudevices", gpu_obj("gpu-a", 0))
        fake.seed("configmaps", {"metadata": {"name": "gpupool-decision-keys",
                                              "namespace": "gpupool-system"},
                                 "data": KEYS.public().to_data()})
        limits = {names.RESOURCE_REMOTE_GPU: "1", names.RESOURCE_MEMORY: "8192"}
        meta = fake.seed("pods", pod_obj("train", "lab", limits))["metadata"]
        alloc = Allocation(meta["uid"], "cpu-a", 1000, 1024,
                           (Slice("GPU-gpu-a-0", 0, 8192, 0, "main"),), False, "gpu-a")
        notes = records.encode(alloc, "2026-01-01T00:00:00Z")
        notes[names.ANNOTATION_SIGNATURE] = KEYS.active(1.0).sign(
            claims_of(meta["uid"], "lab", "train", notes))
        notes[names.ANNOTATION_PLACEMENT] = "remote-required"
        notes[names.ANNOTATION_SLICE_STATUS] = SliceStatus(
            SliceState.SERVING, "gpu-a", "gpupool-slices/gpupool-slice-0123456789abcdef-1",
            since="2026-01-01T00:00:05Z").encode()
        fake.patch("pods", "train", {"metadata": {"annotations": notes},
                                     "spec": {"nodeName": "cpu-a"}}, "lab")
        fake.patch_status("pods", "train", {"phase": "Running"}, "lab")
        yield write_kubeconfig(tmp_path_factory.mktemp("kube") / "config", fake.url)


def test_the_pod_view_says_where_its_slice_is_served_and_its_servers_state(
        world: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "pod", "lab/train", "--kubeconfig", str(world))
    decision = report["decision"]
    assert decision["node"] == "cpu-a" and decision["servedBy"] == "gpu-a"
    assert decision["counted"] is True
    assert decision["slice"] == {"state": "serving", "node": "gpu-a",
                                 "server": "gpupool-slices/gpupool-slice-0123456789abcdef-1",
                                 "reason": None, "since": "2026-01-01T00:00:05Z"}
    assert kubectl.main(["pod", "lab/train", "--kubeconfig", str(world)]) == 0
    text = capsys.readouterr().out
    assert "a slice server on gpu-a: serving" in text


def test_the_serving_gpu_lists_the_remote_slice_and_the_node_list_keeps_to_gpu_nodes(
        world: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "nodes", "--kubeconfig", str(world))
    assert [n["name"] for n in report["nodes"]] == ["gpu-a"]
    (holder,) = report["nodes"][0]["gpus"][0]["holders"]
    assert (holder["pod"], holder["counted"], holder["remoteFrom"]) == ("lab/train", True,
                                                                        "cpu-a")
