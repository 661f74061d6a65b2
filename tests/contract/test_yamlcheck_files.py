"""Every YAML file a user gives gpupool is checked strictly: the simulator's cluster and
workload files and mix files, the node agent's fake-GPU files and Pod manifests for
``gpupool inspect`` (on the paths gpupool reads, against Kubernetes' own field names)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from lightkube.models import core_v1, meta_v1

from gpupool.cli.inspect import read_pod
from gpupool.contract import podshape
from gpupool.core.errors import InvalidInput
from gpupool.nodeagent.fakegpus import load_entries
from gpupool.sim.generate import MIXES_FILE, read_mixes
from gpupool.sim.native import read_cluster, read_workload

REPO = Path(__file__).resolve().parents[2]


def lines_of(exc: pytest.ExceptionInfo[InvalidInput], folder: Path) -> list[str]:
    return [line.replace(f"{folder}/", "") for line in str(exc.value).splitlines()]


def test_a_misspelt_workload_key_is_an_error_naming_file_line_and_the_closest_key(
        tmp_path: Path) -> None:
    path = tmp_path / "pods.yaml"
    path.write_text("pods:\n"
                    "  - name: train-{i}\n"
                    "    replica: 3\n"
                    "    containers:\n"
                    "      - {gpu: 1, gpuMemroy: 8Gi}\n")
    with pytest.raises(InvalidInput) as caught:
        read_workload(path)
    assert lines_of(caught, tmp_path) == [
        "pods.yaml:3:5: unknown key 'replica' in pods[0] (did you mean 'replicas'?)",
        "pods.yaml:5:18: unknown key 'gpuMemroy' in pods[0].containers[0] "
        "(did you mean 'gpuMemory'?)",
    ]


def test_a_misspelt_cluster_key_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("nodes:\n  - name: a\n    cpu: 8\n    memory: 32Gi\n"
                    "    gpus: {count: 2, model: T4, memroy: 16Gi}\n")
    with pytest.raises(InvalidInput) as caught:
        read_cluster(path)
    assert lines_of(caught, tmp_path) == [
        "cluster.yaml:5:11: nodes[0].gpus: missing required key 'memory'",
        "cluster.yaml:5:33: unknown key 'memroy' in nodes[0].gpus (did you mean 'memory'?)",
    ]


def test_the_documented_native_examples_and_the_shipped_mixes_pass() -> None:
    read_cluster(REPO / "tests/sim/data/classes.yaml")
    read_workload(REPO / "tests/sim/data/classes.yaml")
    assert read_mixes(MIXES_FILE)


def test_a_misspelt_mix_key_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "mixes.yaml"
    path.write_text("mixes:\n  - name: a\n    constraind: 0.2\n")
    with pytest.raises(InvalidInput) as caught:
        read_mixes(path)
    assert lines_of(caught, tmp_path) == [
        "mixes.yaml:3:5: unknown key 'constraind' in mixes[0] (did you mean 'constrained'?)"]


def test_a_misspelt_fake_gpu_key_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text("gpus:\n  - uuid: GPU-0\n    memoryMiB: 16384\n    helth: Unhealthy\n"
                    "    processes: [{pid: 1, memoryMib: 10}]\n")
    with pytest.raises(InvalidInput) as caught:
        load_entries(path)
    assert lines_of(caught, tmp_path) == [
        "gpus.yaml:4:5: unknown key 'helth' in gpus[0] (did you mean 'health'?)",
        "gpus.yaml:5:26: unknown key 'memoryMib' in gpus[0].processes[0] "
        "(did you mean 'memoryMiB'?)",
    ]


POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: train
  labels: {app: x, gpupool.io/group: team-a}
  annotations: {gpupool.io/mode: shared, gpupool.io/over-use: "{}", example.com/x: y}
spec:
  priorityClassName: high
  nodeSelector: {pool: gpu}
  securityContext: {runAsNonRoot: true, anything: [the, API, server, decides]}
  tolerations: [{key: k, operator: Exists}]
  volumes: [{name: v, emptyDir: {}}]
  initContainers:
    - {name: init, image: busybox, resources: {requests: {cpu: 100m}}}
  containers:
    - name: main
      image: trainer
      env: [{name: A, value: "1"}]
      volumeMounts: [{name: v, mountPath: /v}]
      resources:
        limits: {cpu: "4", memory: 16Gi, gpupool.io/gpu-memory: "8192",
                 class.gpupool.io/big-mem: "1", example.com/fpga: "1"}
        claims: [{name: c}]
status: {phase: Pending}
"""


def test_a_valid_pod_with_fields_gpupool_does_not_model_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text(POD)
    assert read_pod(path)["metadata"]["name"] == "train"


@pytest.mark.parametrize(("change", "line"), [
    (("gpupool.io/gpu-memory", "gpupool.io/gpu-memroy"),
     "pod.yaml:21:42: unknown key 'gpupool.io/gpu-memroy' in spec.containers[0].resources"
     ".limits (did you mean 'gpupool.io/gpu-memory'?)"),
    (("      resources:", "      resouces:"),
     "pod.yaml:20:7: unknown key 'resouces' in spec.containers[0] (did you mean 'resources'?)"),
    (("  containers:", "  containres:"),
     "pod.yaml:8:3: spec: missing required key 'containers'\n"
     "pod.yaml:15:3: unknown key 'containres' in spec (did you mean 'containers'?)"),
    (("gpupool.io/mode: shared", "gpupool.io/mdoe: shared"),
     "pod.yaml:6:17: unknown key 'gpupool.io/mdoe' in metadata.annotations "
     "(did you mean 'gpupool.io/mode'?)"),
    (("priorityClassName", "priorityClass"),
     "pod.yaml:8:3: unknown key 'priorityClass' in spec (did you mean 'priorityClassName'?)"),
    (("labels: {app: x,", "labels: {app: 1,"),
     "pod.yaml:5:17: metadata.labels.app: expected a string, got a whole number '1'"),
], ids=["a misspelt gpupool resource", "a misspelt container field", "a misspelt spec field",
        "a misspelt gpupool annotation", "a field Kubernetes does not have",
        "a label that is not a string"])
def test_a_pod_manifest_is_checked_like_kubectl_strict_validation(
        tmp_path: Path, change: tuple[str, str], line: str) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text(POD.replace(*change))
    with pytest.raises(InvalidInput) as caught:
        read_pod(path)
    assert lines_of(caught, tmp_path) == line.splitlines()


@pytest.mark.parametrize(("ours", "theirs"), [
    ((*podshape.POD_SPEC_FIELDS, "containers", "initContainers"), core_v1.PodSpec),
    ((*podshape.CONTAINER_FIELDS, "resources"), core_v1.Container),
    (tuple(podshape.RESOURCES.fields), core_v1.ResourceRequirements),
    (tuple(k for k in podshape.OBJECT_META.fields), meta_v1.ObjectMeta),
], ids=["PodSpec", "Container", "ResourceRequirements", "ObjectMeta"])
def test_the_pod_field_lists_are_kubernetes_own(ours: tuple[str, ...], theirs: type) -> None:
    assert sorted(ours) == sorted(inspect.signature(theirs).parameters)
