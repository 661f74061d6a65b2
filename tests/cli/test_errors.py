"""Errors say what and where, in one line, exactly: the file and line of a bad value, the
command and server of a call nothing answered, the closest name of a misspelt one."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.cli.main import main
from gpupool.sim.native import read_workload
from gpupool.sim.trace import read_nodes
from tests.sim.paths import DATA

NODES_CSV = DATA / "one_gpu_nodes.csv"
POLICY_NAMES = "best-fit, clustering, dot-product, fgd, fgd-balance, packing, random, spread"
CLUSTER_YAML = "nodes:\n  - {name: n, cpu: 8, memory: 32Gi, gpus: {count: 1, model: T4, " \
               "memory: 16Gi}}\n"


def error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one line a command that fails with exit code 2 prints."""
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's own exit
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    return err.rstrip("\n")


def simulate_pods(capsys: pytest.CaptureFixture[str], pods: Path, tmp_path: Path) -> str:
    return error(capsys, "simulate", "--nodes", str(NODES_CSV), "--pods", str(pods),
                 "--out", str(tmp_path / "out"))


def workload(tmp_path: Path, containers: str) -> Path:
    path = tmp_path / "pods.yaml"
    path.write_text(CLUSTER_YAML + "pods:\n  - name: p\n    cpu: 1\n    containers:\n"
                    f"      - {containers}\n")
    return path


def test_a_pod_csv_asking_too_many_gpus_names_file_line_and_column(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
                    "fine,1000,1024,1,1000\n"
                    "greedy,1000,1024,1000000,1000\n")
    assert simulate_pods(capsys, pods, tmp_path) == (
        f"gpupool: {pods}:3: num_gpu must be 0..64, got 1000000")


def test_a_yaml_container_asking_too_many_gpus_names_file_line_and_entry(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pods = workload(tmp_path, "{name: main, gpu: 1000000}")
    assert simulate_pods(capsys, pods, tmp_path) == (
        f"gpupool: {pods}:7: pods[0].containers[0].gpu: must be 0..64, got 1000000")


def test_a_bad_slice_is_said_without_the_cores_placeholder_for_a_nameless_container(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pods = workload(tmp_path, "{gpuCore: 150}")
    assert simulate_pods(capsys, pods, tmp_path) == (
        f"gpupool: {pods}:7: pods[0].containers[0]: gpu-core must be 0..100 and gpu-memory "
        ">= 0 (got 150 % and 0 MiB)")


@pytest.mark.parametrize(("container", "gpus"), [
    ("{name: sidecar, gpu: 0}", ()),
    ("{name: sidecar}", ()),
    ("{gpu: 2}", ((2, 0, "exclusive"),)),
    ("{gpuCore: 30}", ((1, 30, "shared"),)),
    ("{gpu: 2, gpuCore: 30}", ((2, 30, "shared"),)),
], ids=["gpu 0", "gpu left out", "two whole", "a slice without gpu", "two slices"])
def test_gpu_0_and_a_left_out_gpu_both_ask_no_gpu_as_in_a_pod_manifest(
        tmp_path: Path, container: str, gpus: tuple[tuple[int, int, str], ...]) -> None:
    (pod,) = read_workload(workload(tmp_path, container))
    assert tuple((d.count, d.core_pct, d.mode.value) for d in pod.request.gpus) == gpus


@pytest.mark.parametrize(("container", "message"), [
    ("{gpu: 0, gpuCore: 10}", "pods[0].containers[0].gpu: is 0 but gpuMemory or gpuCore is "
                              "asked (a container that asks no GPU names none of the three, "
                              "or gpu: 0 alone)"),
    ("{mode: shared}", "pods[0].containers[0].mode: a container that asks no GPU has no mode "
                       "(give gpu, gpuMemory or gpuCore)"),
], ids=["gpu 0 with a slice", "a mode without a GPU"])
def test_a_container_that_contradicts_itself_is_refused_with_its_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], container: str,
        message: str) -> None:
    pods = workload(tmp_path, container)
    assert simulate_pods(capsys, pods, tmp_path) == f"gpupool: {pods}:7: {message}"


@pytest.mark.parametrize("text", ["", "\n\n", "# nothing yet\n"],
                         ids=["empty", "blank lines", "only a comment"])
def test_an_empty_yaml_file_says_so_and_what_it_should_hold(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> None:
    empty = tmp_path / "cluster.yaml"
    empty.write_text(text)
    assert error(capsys, "simulate", "--nodes", str(empty), "--pods", str(empty)) == (
        f"gpupool: {empty}: empty (no YAML document, only blank lines or comments); "
        "expected a map with nodes: and/or pods:")


def test_an_empty_pod_manifest_says_so(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "pod.yaml"
    empty.write_text("")
    assert error(capsys, "inspect", "--nodes", str(NODES_CSV), "--pod", str(empty)) == (
        f"gpupool: {empty}: empty (no YAML or JSON document, only blank lines or comments); "
        "expected one Pod")


def test_an_empty_csv_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "nodes.csv"
    empty.write_text("")
    assert error(capsys, "simulate", "--nodes", str(empty), "--pods", str(empty)) == (
        f"gpupool: {empty}:1: empty file, expected a header line")


def test_a_csv_written_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    marked = tmp_path / "nodes.csv"
    marked.write_bytes(b"\xef\xbb\xbf" + NODES_CSV.read_bytes())
    assert read_nodes(marked) == read_nodes(NODES_CSV)


def test_a_yaml_file_written_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    plain = workload(tmp_path, "{gpu: 1}")
    marked = tmp_path / "marked.yaml"
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    assert read_workload(marked) == read_workload(plain)


@pytest.mark.parametrize("command", [("simulate",), ("inspect", "--nodes", str(NODES_CSV),
                                                     "--pod", str(DATA / "two_gpus_pod.yaml"))],
                         ids=["simulate", "inspect"])
def test_a_misspelt_policy_is_refused_with_the_closest_name_as_a_misspelt_weight_is(
        capsys: pytest.CaptureFixture[str], command: tuple[str, ...]) -> None:
    assert error(capsys, *command, "--policy", "bestfit") == (
        f"gpupool: --policy bestfit: no such policy (did you mean best-fit? known: "
        f"{POLICY_NAMES})")
    assert error(capsys, *command, "--policy", "zzz") == (
        f"gpupool: --policy zzz: no such policy (known: {POLICY_NAMES})")


@pytest.fixture
def silent_server() -> Iterator[str]:
    """An HTTPS address whose connections are accepted (by the kernel) and never answered."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        yield f"https://127.0.0.1:{silent.getsockname()[1]}"


def test_a_controller_whose_api_server_never_answers_names_command_server_and_wait(
        silent_server: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert error(capsys, "controller", "--once", "--server", silent_server,
                 "--request-timeout", "0.5", "--log-level", "CRITICAL") == (
        f"gpupool controller: list GPUDevices: no answer from {silent_server} within 0.5 s "
        "(connecting, TLS handshake included)")
