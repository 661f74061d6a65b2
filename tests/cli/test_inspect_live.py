"""Live ``gpupool inspect`` and ``kubectl gpupool`` against the FAKE API server.

The world (``seed_world``): two nodes of two 40 GiB A100s; GPU #1 of gpu-b isolated by
its node agent; gpupool's public decision key published; three placed team-a pods
whose decisions the extender's key signed (train-1: gpu-a #0 8192 MiB 30 %; train-2:
gpu-b #1 4096 MiB 20 %; train-3, of class a100: gpu-b #0 8192 MiB 10 %), one tenant-x
pod whose decision on gpu-a #1 (the whole GPU) nobody signed, a team-b pod that asks
no GPU resource yet carries a signed decision on gpu-a #0, and two pending team-a
pods: one asking two whole GPUs (over its group's quota of 4 GPUs), one asking
36864 MiB + 50 % of one GPU (fits only gpu-a #1 — if the forged decision counted, it
would fit nowhere). Group team-a-pool holds both nodes with a quota of 4 GPUs and
60000 MiB; group broken has an unknown quota key.

In-process tests go through ``gpupool.cli.main`` / ``gpupool.cli.kubectl`` with a
kubeconfig file pointing at the fake; the last ones run the installed commands as
real processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.cli import kubectl
from gpupool.cli.main import main as gpupool_main
from gpupool.contract import annotations as records
from gpupool.contract import names
from gpupool.core.allocation import Allocation, Slice
from gpupool.core.workload import TargetWorkload
from gpupool.extender.state.ledger import Entry
from gpupool.extender.workload import BUILTIN_WORKLOAD
from gpupool.security.signing import SigningKeys, claims_of

KEYS = SigningKeys().added(0.0)
BIND_TIME = "2026-01-01T00:00:00Z"
QUOTA_MESSAGE = "quota of group team-a-pool exceeded: 2 GPUs asked, 3 of 4 in use, 1 left"


def node_obj(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}}}


def gpu_obj(node: str, index: int) -> dict[str, Any]:
    uuid = f"GPU-{node}-{index}"
    return {"metadata": {"name": uuid.lower(), "labels": {names.LABEL_NODE: node,
                                                           names.LABEL_MODEL: "A100"}},
            "spec": {"node": node, "uuid": uuid, "index": index, "model": "A100",
                     "memoryMiB": 40960},
            "status": {"health": "Healthy"}}


def pod_obj(name: str, ns: str, limits: dict[str, str], **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns},
            "spec": {"schedulerName": "gpupool-scheduler",
                     "containers": [{"name": "main", "image": "busybox", "resources": {
                         "requests": {"cpu": "1", "memory": "1Gi"}, "limits": limits}}]},
            "status": {"phase": "Pending", **status}}


def place(fake: FakeApiServer, pod: dict[str, Any], node: str, gpu: int, memory_mib: int,
          core_pct: int, signed: bool = True) -> None:
    """Create ``pod`` and record gpupool's decision for it, as the extender's bind does."""
    meta = fake.seed("pods", pod)["metadata"]
    uid, ns, name = meta["uid"], meta["namespace"], meta["name"]
    alloc = Allocation(uid, node, 1000, 1024,
                       (Slice(f"GPU-{node}-{gpu}", gpu, memory_mib, core_pct, "main"),))
    notes = records.encode(alloc, BIND_TIME, names.PHASE_ALLOCATED)
    notes[names.ANNOTATION_RESOURCE_GROUP] = "team-a-pool" if ns == "team-a" else ""
    if signed:
        notes[names.ANNOTATION_SIGNATURE] = KEYS.active(1.0).sign(
            claims_of(uid, ns, name, notes))
    fake.patch("pods", name, {"metadata": {"annotations": notes}, "spec": {"nodeName": node}},
               ns)
    fake.patch_status("pods", name, {"phase": "Running"}, ns)


def shared(memory_mib: int, core_pct: int, **more: str) -> dict[str, str]:
    return {names.RESOURCE_MEMORY: str(memory_mib), names.RESOURCE_CORE: str(core_pct), **more}


def seed_world(fake: FakeApiServer) -> None:
    for node in ("gpu-a", "gpu-b"):
        fake.seed("nodes", node_obj(node))
        for j in (0, 1):
            fake.seed("gpudevices", gpu_obj(node, j))
    fake.patch_status("gpudevices", "gpu-gpu-b-1", {"isolation": {
        "state": names.DEVICE_ISOLATED, "reason": "team-a/train-2 used 9000 MiB of its 4096"}})
    fake.seed("configmaps", {"metadata": {"name": "gpupool-decision-keys",
                                          "namespace": "gpupool-system"},
                             "data": KEYS.public().to_data()})
    fake.seed("resourceclasses", {"metadata": {"name": "a100"}, "spec": {
        "selector": {"matchLabels": {"gpupool.io/model": "A100"}}}})
    fake.seed("resourcegroups", {"metadata": {"name": "team-a-pool"}, "spec": {
        "nodes": ["gpu-a", "gpu-b"], "tenants": ["team-a"],
        "quota": {"gpus": 4, "memoryMiB": 60000}}})
    fake.seed("resourcegroups", {"metadata": {"name": "broken"}, "spec": {"quota": {"gpuz": 1}}})
    place(fake, pod_obj("train-1", "team-a", shared(8192, 30)), "gpu-a", 0, 8192, 30)
    place(fake, pod_obj("train-2", "team-a", shared(4096, 20)), "gpu-b", 1, 4096, 20)
    place(fake, pod_obj("train-3", "team-a", shared(8192, 10, **{"class.gpupool.io/a100": "1"})),
          "gpu-b", 0, 8192, 10)
    place(fake, pod_obj("evil", "tenant-x", shared(40960, 100)), "gpu-a", 1, 40960, 100,
          signed=False)
    place(fake, pod_obj("no-gpu", "team-b", {}), "gpu-a", 0, 1024, 5)  # signed, asks no GPU
    fake.seed("pods", pod_obj("waiting", "team-a", {names.RESOURCE_GPU: "2"}, conditions=[
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": f"0/2 nodes are available: 2 gpupool: {QUOTA_MESSAGE}."}]))
    fake.seed("pods", pod_obj("big", "team-a", shared(36864, 50)))


def write_kubeconfig(path: Path, url: str, namespace: str = "team-a") -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me",
                                                  "namespace": namespace}}],
        "users": [{"name": "me", "user": {"token": "not-checked-by-the-fake"}}]}))
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The fake API server with the world seeded; yields a kubeconfig pointing at it."""
    with FakeApiServer() as fake:
        seed_world(fake)
        yield write_kubeconfig(tmp_path_factory.mktemp("kube") / "config", fake.url)


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code = kubectl.main([*argv, "-o", "json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    report: dict[str, Any] = json.loads(out.out)
    return report


def gpus_of(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{n['name']}#{g['index']}": g for n in report["nodes"] for g in n["gpus"]}


# -- nodes ------------------------------------------------------------------------------------


def test_nodes_show_allocation_holders_and_an_isolated_gpu(
        world: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "nodes", "--kubeconfig", str(world))
    gpus = gpus_of(report)
    a0 = gpus["gpu-a#0"]
    assert (a0["model"], a0["health"], a0["isolation"], a0["takesPlacements"]) == (
        "A100", "Healthy", None, True)
    assert a0["memoryMiB"] == {"allocated": 8192, "total": 40960}
    assert a0["corePct"] == {"allocated": 30, "total": 100}
    assert [(h["pod"], h["container"], h["memoryMiB"], h["corePct"], h["signature"],
             h["counted"]) for h in a0["holders"]] == [
        ("team-a/train-1", "main", 8192, 30, "verified", True),
        ("team-b/no-gpu", "main", 1024, 5, "verified", False)]
    assert a0["holders"][1]["note"] == ("the pod asks no gpupool GPU resource, so its "
                                        "decision can hold no GPU")
    b1 = gpus["gpu-b#1"]
    assert b1["isolation"] == {"state": "Isolated",
                               "reason": "team-a/train-2 used 9000 MiB of its 4096"}
    assert b1["takesPlacements"] is False and b1["health"] == "Healthy"
    assert b1["memoryMiB"]["allocated"] == 4096 and b1["corePct"]["allocated"] == 20
    assert [h["pod"] for h in b1["holders"]] == ["team-a/train-2"]


def test_a_forged_decision_is_shown_on_its_gpu_and_not_counted(
        world: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "nodes", "gpu-a", "--kubeconfig", str(world))
    assert [n["name"] for n in report["nodes"]] == ["gpu-a"]
    a1 = gpus_of(report)["gpu-a#1"]
    [holder] = a1["holders"]
    assert (holder["pod"], holder["signature"], holder["counted"]) == (
        "tenant-x/evil", "forged", False)
    assert "carries no gpupool.io/signature" in holder["note"]
    assert a1["memoryMiB"]["allocated"] == 0 and a1["corePct"]["allocated"] == 0
    assert report["signatures"]["checked"] and report["signatures"]["keys"] == [
        KEYS.keys[0].kid]
    assert any(p.startswith("pod tenant-x/evil: not counted: forged decision")
               for p in report["problems"])


def brute_fragmentation(free_milli: list[int], cpu_free_milli: int,
                        workload: TargetWorkload) -> float:
    """The FGD measure by its definition, one shape at a time (the test's own oracle)."""
    usable = [max(f, 0) for f in free_milli]
    total = 0
    for shape, weight in zip(workload.shapes, workload.weights, strict=True):
        room = sum(1 for f in usable if f >= shape.gpu_milli)
        runs = shape.gpu_count > 0 and shape.cpu_milli <= cpu_free_milli and \
            room >= shape.gpu_count
        lost = sum(f for f in usable if f < shape.gpu_milli) if runs else sum(usable)
        total += weight * lost
    return total / workload.total_weight


def test_fragmentation_per_node_is_the_core_measure_against_the_builtin_workload(
        world: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "nodes", "--kubeconfig", str(world))
    assert report["fragmentationWorkload"].startswith("built-in")
    frag = {n["name"]: n["fragmentation"] for n in report["nodes"]}
    # free share: gpu-a #0 = min(70 % core, 128 of 160 memory units) = 700, #1 = 1000 (the
    # forged decision does not count); gpu-b #0 = 800, #1 isolated = none
    a = brute_fragmentation([700, 1000], 61000, BUILTIN_WORKLOAD)
    b = brute_fragmentation([800, -1], 62000, BUILTIN_WORKLOAD)
    assert frag["gpu-a"] == {"milliGpu": round(a), "freeMilliGpu": 1700,
                             "percentOfFree": round(100 * a / 1700, 1)}
    assert frag["gpu-b"] == {"milliGpu": round(b), "freeMilliGpu": 800,
                             "percentOfFree": round(100 * b / 800, 1)}
    cpu = {n["name"]: n["cpuMilli"] for n in report["nodes"]}
    assert cpu["gpu-a"] == {"allocated": 3000, "total": 64000}  # train-1, evil's, no-gpu's


def test_the_nodes_table_marks_forged_and_isolated(
        world: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    assert kubectl.main(["nodes", "--kubeconfig", str(world)]) == 0
    lines = capsys.readouterr().out.splitlines()
    [b1] = [line for line in lines if "gpu-b" in line and "#1" in line]
    assert "Isolated: team-a/train-2 used 9000 MiB of its 4096" in b1
    assert "4096/40960" in b1 and "team-a/train-2 (main) 4096 MiB 20 %" in b1
    [a1] = [line for line in lines if "gpu-a" in line and "#1" in line]
    assert "tenant-x/evil (main) 40960 MiB 100 % FORGED decision, not counted" in a1


# -- one pod ----------------------------------------------------------------------------------


def test_a_placed_pod_shows_its_decision_and_a_verified_signature(
        world: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "pod", "team-a/train-3", "--kubeconfig", str(world))
    assert (report["pod"], report["node"], report["phase"]) == ("team-a/train-3", "gpu-b",
                                                                "Running")
    d = report["decision"]
    assert (d["node"], d["phase"], d["bindTime"], d["group"], d["counted"]) == (
        "gpu-b", "allocated", BIND_TIME, "team-a-pool", True)
    assert d["gpus"] == [{"container": "main", "uuid": "GPU-gpu-b-0", "index": 0,
                          "model": "A100", "memoryMiB": 8192, "corePct": 10}]
    assert report["signature"] == {"present": True, "state": "verified",
                                   "key": KEYS.keys[0].kid,
                                   "message": f"signed by gpupool's decision key "
                                              f"{KEYS.keys[0].kid}"}
    assert report["request"]["class"] == "a100" and report["fit"] is None


def test_a_pod_with_an_unsigned_decision_is_shown_as_forged(
        world: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    report = run_json(capsys, "pod", "evil", "-n", "tenant-x", "--kubeconfig", str(world))
    assert report["signature"]["present"] is False
    assert report["signature"]["state"] == "forged"
    assert report["decision"]["counted"] is False
    assert report["decision"]["why"].startswith("forged decision: ")
    monkeypatch.setenv("COLUMNS", "250")
    assert kubectl.main(["pod", "tenant-x/evil", "--kubeconfig", str(world)]) == 0
    out = capsys.readouterr().out
    assert "signature  absent, FORGED: pod tenant-x/evil: the decision carries no " \
           "gpupool.io/signature" in out


def test_a_pending_pod_fits_only_where_the_forged_decision_is_not_counted(
        world: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "pod", "big", "--kubeconfig", str(world))  # context ns team-a
    assert report["decision"] is None and report["node"] is None
    fit = report["fit"]
    assert (fit["chosen"], fit["blocked"], fit["fitting"]) == ("gpu-a", None, 1)
    nodes = {n["node"]: n for n in fit["nodes"]}
    assert [(g["index"], g["memoryMiB"], g["corePct"]) for g in nodes["gpu-a"]["gpus"]] == [
        (1, 36864, 50)]
    assert not nodes["gpu-b"]["fits"] and nodes["gpu-b"]["permanent"] is False
    assert nodes["gpu-b"]["reason"].startswith("node gpu-b: ")


def test_a_pending_pod_over_its_group_quota_says_so_with_the_scheduler_message(
        world: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    report = run_json(capsys, "pod", "team-a/waiting", "--kubeconfig", str(world))
    assert QUOTA_MESSAGE in report["fit"]["blocked"]
    assert report["scheduling"]["reason"] == "Unschedulable"
    monkeypatch.setenv("COLUMNS", "300")
    assert kubectl.main(["pod", "team-a/waiting", "--kubeconfig", str(world)]) == 0
    out = capsys.readouterr().out
    assert "Where it fits now: nowhere; refused before any node: " in out
    assert "scheduler  Unschedulable: 0/2 nodes are available" in out


def test_a_pod_that_does_not_exist_exits_1(world: Path, capsys: pytest.CaptureFixture[str]
                                           ) -> None:
    assert kubectl.main(["pod", "nope", "--kubeconfig", str(world)]) == 1
    assert capsys.readouterr().err.strip() == \
        "pod nope not found in namespace team-a (context fake)"


# -- groups -----------------------------------------------------------------------------------


def test_groups_show_quota_used_and_limit_and_a_broken_group(
        world: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "groups", "--kubeconfig", str(world))
    groups = {g["name"]: g for g in report["groups"]}
    team = groups["team-a-pool"]
    assert team["quota"] == {"gpus": {"used": 3, "limit": 4},
                             "memoryMiB": {"used": 20480, "limit": 60000},
                             "corePct": {"used": 60, "limit": None}}
    assert (team["withinQuota"], team["pods"], team["memberGpus"]) == (True, 3, 4)
    assert groups["broken"]["valid"] is False
    assert "spec.quota has unknown keys gpuz" in groups["broken"]["problem"]
    assert report["tenants"] == [{"tenant": "team-a",
                                  "used": {"gpus": 3, "memoryMiB": 20480, "corePct": 60},
                                  "classes": {"a100": 1}}]


def test_yaml_is_the_same_report_as_json(world: Path, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    as_json = run_json(capsys, "groups", "--kubeconfig", str(world))
    assert kubectl.main(["groups", "--kubeconfig", str(world), "-o", "yaml"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == as_json


def test_gpupool_inspect_runs_the_same_views(
        world: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert gpupool_main(["inspect", "--kubeconfig", str(world), "groups", "-o", "json"]) == 0
    via_inspect = json.loads(capsys.readouterr().out)
    assert via_inspect == run_json(capsys, "groups", "--kubeconfig", str(world))


def test_kubeconfig_from_the_environment_and_the_context_namespace(
        world: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(tmp_path / "absent"), str(world)]))
    report = run_json(capsys, "pod", "train-1")  # namespace team-a from the context
    assert report["pod"] == "team-a/train-1"


def test_a_view_with_no_cluster_behind_the_kubeconfig_names_the_server(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_kubeconfig(tmp_path / "config", "http://127.0.0.1:9")
    assert kubectl.main(["nodes", "--kubeconfig", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0] == (f"kubectl gpupool: kubeconfig {config}: server http://127.0.0.1:9 "
                      "(context fake) cannot be reached: connection refused (is the cluster "
                      "running and is this its address? `kubectl cluster-info` tries the same)")


# -- the installed commands, as real processes ------------------------------------------------


def command(name: str) -> str:
    """An installed console script beside this interpreter (pip install -e . made it)."""
    path = Path(sys.executable).parent / name
    assert path.exists(), f"{name} is not installed; run pip install -e . again"
    return str(path)


def run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "COLUMNS": "250", **(env or {})})


def test_gpupool_inspect_as_a_process_shows_nodes_as_json(world: Path) -> None:
    proc = run(command("gpupool"), "inspect", "--kubeconfig", str(world), "nodes", "-o", "json")
    assert proc.returncode == 0, proc.stderr
    gpus = gpus_of(json.loads(proc.stdout))
    assert gpus["gpu-b#1"]["isolation"]["state"] == "Isolated"
    assert gpus["gpu-a#1"]["holders"][0]["signature"] == "forged"


def test_gpupool_inspect_as_a_process_shows_a_pod_as_yaml(world: Path) -> None:
    proc = run(command("gpupool"), "inspect", "pod", "tenant-x/evil", "-o", "yaml",
               "--kubeconfig", str(world))
    assert proc.returncode == 0, proc.stderr
    report = yaml.safe_load(proc.stdout)
    assert (report["signature"]["state"], report["decision"]["counted"]) == ("forged", False)


@pytest.mark.parametrize("program", ["gpupool", "kubectl-gpupool"])
def test_a_broken_kubeconfig_is_one_line_and_exit_2_in_a_process(
        tmp_path: Path, program: str) -> None:
    broken = tmp_path / "config"
    broken.write_text("apiVersion: v1\nclusters:\n  - name: a\n   cluster: {}\n")
    argv = ["inspect", "nodes"] if program == "gpupool" else ["nodes"]
    proc = run(command(program), *argv, "--kubeconfig", str(broken))
    assert proc.returncode == 2
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert f"kubeconfig {broken}: not valid YAML (line 4, column 4" in line


def test_without_published_keys_signatures_are_not_checked_and_decisions_count(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with FakeApiServer() as fake:
        fake.seed("nodes", node_obj("gpu-a"))
        fake.seed("gpudevices", gpu_obj("gpu-a", 0))
        place(fake, pod_obj("old", "team-a", shared(2048, 10)), "gpu-a", 0, 2048, 10,
              signed=False)
        report = run_json(capsys, "nodes", "--kubeconfig",
                          str(write_kubeconfig(tmp_path / "config", fake.url)))
    assert report["signatures"] == {
        "checked": False, "keys": [],
        "problem": "ConfigMap gpupool-system/gpupool-decision-keys does not exist (gpupool "
                   "publishes no decision keys in this cluster; see --gpupool-namespace)"}
    [holder] = gpus_of(report)["gpu-a#0"]["holders"]
    assert (holder["signature"], holder["counted"]) == ("unchecked", True)
    assert gpus_of(report)["gpu-a#0"]["memoryMiB"]["allocated"] == 2048


def test_an_unsigned_decision_counts_only_when_its_ledger_entry_vouches_for_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with FakeApiServer() as fake:
        fake.seed("nodes", node_obj("gpu-a"))
        for j in (0, 1):
            fake.seed("gpudevices", gpu_obj("gpu-a", j))
        fake.seed("configmaps", {"metadata": {"name": "gpupool-decision-keys",
                                              "namespace": "gpupool-system"},
                                 "data": KEYS.public().to_data()})
        place(fake, pod_obj("old", "team-a", shared(2048, 10)), "gpu-a", 0, 2048, 10,
              signed=False)
        place(fake, pod_obj("edited", "team-a", shared(2048, 10)), "gpu-a", 1, 2048, 10,
              signed=False)
        entries = {}
        for name, gpu, memory_mib in (("old", 0, 2048), ("edited", 1, 1024)):
            uid = fake.get("pods", name, "team-a")["metadata"]["uid"]
            alloc = Allocation(uid, "gpu-a", 1000, 1024,
                               (Slice(f"GPU-gpu-a-{gpu}", gpu, memory_mib, 10, "main"),))
            entries[uid] = Entry(alloc, f"team-a/{name}", BIND_TIME, "team-a", None,
                                 "team-a-pool").to_json()
        fake.seed("gpuledgers", {"metadata": {"name": "gpu-a"},
                                 "spec": {"node": "gpu-a", "entries": entries}})
        report = run_json(capsys, "nodes", "--kubeconfig",
                          str(write_kubeconfig(tmp_path / "config", fake.url)))
    gpus = gpus_of(report)
    [old] = gpus["gpu-a#0"]["holders"]
    assert (old["pod"], old["signature"], old["counted"]) == ("team-a/old", "ledger", True)
    [edited] = gpus["gpu-a#1"]["holders"]  # its annotation says 2048 MiB, its entry 1024
    assert (edited["pod"], edited["signature"], edited["counted"]) == (
        "team-a/edited", "forged", False)
