"""gpupool's own YAML: clusters with classes, workloads with containers and times."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gpupool.core.errors import InvalidInput, UnknownName
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.request import Affinity, Mode
from gpupool.core.state import ClusterState
from gpupool.sim.decision import Decider
from gpupool.sim.native import read_cluster, read_workload
from gpupool.sim.scenario import Scenario
from gpupool.sim.sources import scenario_from_files
from gpupool.sim.timed import run_timed
from tests.sim.paths import DATA, REPO


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "x.yaml"
    path.write_text(text)
    return path


def test_cluster_expands_replicas_and_reads_gpu_lists_and_classes() -> None:
    nodes, classes = read_cluster(DATA / "classes.yaml")
    assert [n.name for n in nodes] == ["t4-0", "t4-1", "a100-0"]
    t4 = nodes[0]
    assert (t4.cpu_milli, t4.memory_mib, len(t4.gpus)) == (32000, 128 * 1024, 2)
    assert dict(t4.labels) == {"pool": "inference"}
    a100 = nodes[2]
    assert [g.memory_mib for g in a100.gpus] == [80 * 1024, 80 * 1024]
    assert dict(a100.gpus[1].labels) == {"nvlink": "true"}
    (big,) = classes
    assert big.name == "big-memory"
    assert big.matches(a100.gpus[0]) and not big.matches(t4.gpus[0])


def test_workload_reads_containers_modes_affinity_times_and_models() -> None:
    pods = {p.request.key: p for p in read_workload(DATA / "classes.yaml")}
    assert sorted(pods) == ["pair-0", "pair-1", "pinned", "train"]
    pair = pods["pair-0"]
    model, sidecar = pair.request.gpus
    assert (model.container, model.memory_mib, model.core_pct, model.mode) == (
        "model", 4096, 30, Mode.SHARED)
    assert (sidecar.container, sidecar.core_pct) == ("sidecar", 10)
    assert pair.request.affinity is Affinity.POD
    assert (pair.creation_s, pair.deletion_s) == (0.0, 60.0)
    assert pods["train"].request.gpu_class == "big-memory"
    assert pods["pinned"].request.models == frozenset({"T4"})
    assert pods["pinned"].request.gpus[0].mode is Mode.EXCLUSIVE  # no slice asked: whole GPUs
    assert pods["train"].creation_s is None


def test_one_file_can_be_both_cluster_and_workload() -> None:
    scenario = scenario_from_files(DATA / "classes.yaml", DATA / "classes.yaml")
    assert len(scenario.nodes) == 3 and len(scenario.pods) == 4 and len(scenario.classes) == 1


def test_a_pod_naming_an_unknown_class_is_refused_when_the_scenario_is_built() -> None:
    nodes, _ = read_cluster(DATA / "classes.yaml")
    pods = read_workload(DATA / "classes.yaml")
    with pytest.raises(UnknownName, match="big-memory does not exist"):
        Scenario("x", tuple(nodes), tuple(pods), ())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nodes: [{name: n, memory: 1Gi}]",
         r"x.yaml:1:9: nodes\[0\]: missing required key 'cpu'"),
        ("nodes: [{name: n, cpu: lots, memory: 1Gi}]", r"nodes\[0\].cpu"),
        ("nodes: [{name: n, cpu: 1, memory: 1Gi, gpus: {count: 1, model: T4}}]",
         r"nodes\[0\].gpus: missing required key 'memory'"),
        ("nodes: [{name: n, replicas: 2, cpu: 1, memory: 1Gi}]", r"must contain \{i\}"),
        ("nodes: [{name: n, cpu: 1, memory: 1Gi}, {name: n, cpu: 1, memory: 1Gi}]",
         "node n appears twice"),
        ("nodes: {name: n}", "nodes: expected a list"),
        ("- just a list", "document: expected a map"),
        ("nodes: [", "not valid YAML"),
        ("classes: [{name: c}]\nnodes: []", "nodes: no nodes"),
    ],
)
def test_bad_cluster_names_file_and_entry(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InvalidInput, match=message) as err:
        read_cluster(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("pods: [{name: p, containers: [{gpu: 1, gpuCore: 120}]}]",
         r"pods\[0\].containers\[0\]: .*gpu-core must be 0..100"),
        ("pods: [{name: p, containers: [{gpu: 1, mode: sometimes}]}]", r"containers\[0\].mode"),
        ("pods: [{name: p, creation: 10, deletion: 5}]", r"pods\[0\].deletion: 5.0 is before"),
        ("pods: [{name: p, creation: soon}]",
         r"pods\[0\].creation: expected a number, got a string 'soon'"),
        ("pods: [{name: p, affinity: glued}]", r"pods\[0\].affinity"),
        ("pods: [{name: p, models: []}]", r"pods\[0\]: .*allowed GPU models is empty"),
        ("pods: [{cpu: 1}]", r"pods\[0\]: missing required key 'name'"),
        ("pods: []", "pods: no pods"),
    ],
)
def test_bad_workload_names_file_and_entry(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        read_workload(write(tmp_path, text))


def test_a_class_pod_goes_to_the_gpus_of_its_class() -> None:
    scenario = scenario_from_files(DATA / "classes.yaml", DATA / "classes.yaml")
    state = ClusterState(scenario.nodes)
    decider = Decider(state, "best-fit", PolicyConfig(), seed=1, classes=scenario.classes)
    train = next(p.request for p in scenario.pods if p.request.key == "train")
    pinned = next(p.request for p in scenario.pods if p.request.key == "pinned")
    for seed in range(3):  # whatever the tie-breaks, the class decides
        decider.rng = random.Random(seed)
        alloc = decider.decide(train)
        assert alloc is not None and alloc.node == "a100-0"
        pinned_alloc = decider.decide(pinned)
        assert pinned_alloc is not None and pinned_alloc.node.startswith("t4-")


def test_the_example_in_the_docs_reads_and_runs(tmp_path: Path) -> None:
    text = (REPO / "docs" / "simulator.md").read_text()
    example = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "example.yaml"
    path.write_text(example)
    scenario = scenario_from_files(path, path)
    assert len(scenario.nodes) == 5 and len(scenario.pods) == 4
    assert not scenario.nodes[-1].gpus[1].healthy
    timed = [p for p in scenario.pods if p.creation_s is not None]
    run = run_timed(Scenario("x", scenario.nodes, tuple(timed), scenario.classes), "best-fit",
                    1, PolicyConfig())
    assert run.failed_pods == 0 and run.peak_live_pods == 3  # train + both pairs
