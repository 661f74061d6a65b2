"""Reading the Alibaba trace CSVs into core values, and refusing malformed rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.core.errors import InvalidInput
from gpupool.core.request import Mode
from gpupool.sim.trace import GPU_MEMORY_MIB, read_nodes, read_pods
from tests.sim.paths import DATA

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_node_row_becomes_a_node_with_identical_gpus_of_its_model() -> None:
    (node,) = read_nodes(DATA / "two_gpu_nodes.csv")
    assert (node.name, node.cpu_milli, node.memory_mib) == ("pair", 16000, 65536)
    assert [g.model for g in node.gpus] == ["V100M16", "V100M16"]
    assert {g.memory_mib for g in node.gpus} == {GPU_MEMORY_MIB["V100M16"]}
    assert len({g.uuid for g in node.gpus}) == 2


def test_cpu_only_node_has_no_gpus(tmp_path: Path) -> None:
    path = write(tmp_path, "n.csv", NODE_HEADER + "cpu-box,32000,131072,0,\n")
    (node,) = read_nodes(path)
    assert node.gpus == () and node.cpu_milli == 32000


def test_pod_rows_map_to_no_gpu_shared_core_exclusive_and_models() -> None:
    pods = {p.request.key: p for p in read_pods(DATA / "mapping_pods.csv")}
    assert pods["cpu-only"].request.gpus == ()
    (share,) = pods["share"].request.gpus
    assert (share.count, share.memory_mib, share.core_pct, share.mode) == (1, 0, 47, Mode.SHARED)
    (whole,) = pods["whole"].request.gpus
    assert (whole.count, whole.mode) == (1, Mode.EXCLUSIVE)
    assert pods["whole"].request.models == frozenset({"V100M16", "V100M32"})
    assert pods["share"].request.models is None
    (eight,) = pods["eight"].request.gpus
    assert (eight.count, eight.mode) == (8, Mode.EXCLUSIVE)
    assert (pods["eight"].request.cpu_milli, pods["eight"].request.memory_mib) == (64000, 262144)


def test_times_are_read_and_a_missing_deletion_means_never() -> None:
    pods = {p.request.key: p for p in read_pods(DATA / "mapping_pods.csv")}
    assert (pods["whole"].creation_s, pods["whole"].deletion_s) == (7.0, 900.0)
    assert pods["share"].deletion_s is None


def test_five_column_file_has_no_times() -> None:
    pods = read_pods(DATA / "two_shares_pods.csv")
    assert [p.creation_s for p in pods] == [None, None]


def test_a_fraction_that_is_not_a_whole_percent_rounds_up(tmp_path: Path) -> None:
    path = write(tmp_path, "p.csv", POD_HEADER + "odd,1000,0,1,475\n")
    (pod,) = read_pods(path)
    assert pod.request.gpus[0].core_pct == 48


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("p,1000,0,2,500", "needs num_gpu 1"),
        ("p,1000,0,1,1500", "gpu_milli must be 1..1000"),
        ("p,1000,0,1,0", "gpu_milli must be 1..1000"),
        ("p,1000,0,0,300", "num_gpu is 0"),
        ("p,lots,0,1,1000", "cpu_milli must be a whole number"),
        ("p,-5,0,1,1000", "cpu_milli must be >= 0"),
        ("p,1000,0,1", "expected 5 fields"),
        (",1000,0,1,1000", "empty pod name"),
    ],
)
def test_malformed_pod_row_names_file_and_line(tmp_path: Path, row: str, message: str) -> None:
    path = write(tmp_path, "pods.csv", POD_HEADER + "ok,1000,0,0,0\n" + row + "\n")
    with pytest.raises(InvalidInput, match=message) as err:
        read_pods(path)
    assert f"{path}:3:" in str(err.value)


def test_duplicate_pod_name_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "pods.csv", POD_HEADER + "p,1,0,0,0\np,1,0,0,0\n")
    with pytest.raises(InvalidInput, match=r":3: pod p appears twice"):
        read_pods(path)


def test_deletion_before_creation_is_refused(tmp_path: Path) -> None:
    header = POD_HEADER.strip() + ",creation_time,deletion_time\n"
    path = write(tmp_path, "pods.csv", header + "p,1,0,0,0,100,50\n")
    with pytest.raises(InvalidInput, match="before creation_time"):
        read_pods(path)


def test_missing_column_is_reported_on_the_header_line(tmp_path: Path) -> None:
    path = write(tmp_path, "pods.csv", "name,cpu_milli,memory_mib,num_gpu\np,1,0,0\n")
    with pytest.raises(InvalidInput, match=r"pods.csv:1: missing column\(s\) gpu_milli"):
        read_pods(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (NODE_HEADER + "n,96000,1024,8,H9000\n", r":2: unknown GPU model 'H9000'"),
        (NODE_HEADER + "n,96000,1024,eight,G2\n", r":2: gpu must be a whole number"),
        (NODE_HEADER + "n,1,1,1,T4\nn,1,1,1,T4\n", r":3: node n appears twice"),
        ("", r":1: empty file"),
        (NODE_HEADER, r"no nodes"),
    ],
)
def test_malformed_node_file_is_refused(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        read_nodes(write(tmp_path, "nodes.csv", text))


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="cannot read"):
        read_nodes(tmp_path / "absent.csv")
