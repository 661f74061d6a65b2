"""Tenants in the simulator, their own limits: a permission confines a tenant to its nodes,
a tenant quota and a per-class quota cap what it holds at every instant (beside its group's
quota), with the extender's reasons; the keys are checked like every other key."""

from __future__ import annotations

import textwrap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gpupool.cli.main import main
from gpupool.core.errors import InvalidInput
from gpupool.core.policies.config import PolicyConfig
from gpupool.sim.campaign import Campaign
from gpupool.sim.scenario import Scenario
from gpupool.sim.sources import scenario_from_files
from gpupool.sim.tenants import Tenancy, read_tenancy, tenancy_for
from gpupool.sim.tenants_replay import TenantRun, run_tenants
from gpupool.sim.tenants_report import limit_rows
from tests.sim.paths import REPO

EXAMPLE = REPO / "examples" / "tenants-permissions.yaml"
T4_NODES = {"t4-0", "t4-1"}


def example() -> tuple[Scenario, Tenancy, PolicyConfig]:
    scenario = scenario_from_files(EXAMPLE, EXAMPLE)
    found = tenancy_for(scenario, EXAMPLE, None, None)
    assert found is not None
    scenario, tenancy = found
    return scenario, tenancy, Campaign(scenario, ("best-fit",), (1,)).config()


def replay(tenancy_change: dict[str, object] | None = None) -> TenantRun:
    scenario, tenancy, config = example()
    return run_tenants(scenario, replace(tenancy, **(tenancy_change or {})), "best-fit", 1,
                       config)


def test_a_permission_confines_its_tenant_to_the_nodes_it_selects() -> None:
    run = replay()
    b = run.tenants["team-b"]
    assert b.nodes == T4_NODES and b.pods == 10
    assert len(b.permission) == 2  # 8 T4s for 10 pods, while A100s stood idle
    assert b.reason == "no room on the GPUs of GPUPermission team-b-t4"
    assert run.waiting_at_end["team-b"] == 0  # they start when T4 pods end
    free = replay({"permissions": ()})
    assert free.tallies["team-b"].waits and max(free.tallies["team-b"].waits) == 0
    assert max(free.held["team-b"]) == 10  # without it, team-b spills onto the A100s


def test_a_tenant_quota_caps_the_gpus_its_tenant_holds_at_every_instant() -> None:
    run = replay()
    held = np.asarray(run.tenant_held["team-a"])
    assert held.size == len(run.times) and held.max() == 6 and (held <= 6).all()
    assert max(run.held["team-a"]) == 6  # below the group's nominal of 8: the tighter cap
    assert len(run.tenants["team-a"].tenant_quota) >= 2
    assert max(replay({"quotas": ()}).held["team-a"]) == 8  # the group's cap alone


def test_a_class_quota_caps_that_class_of_its_tenant() -> None:
    run = replay()
    a100 = np.asarray(run.class_held["team-a", "a100"])
    assert a100.max() == 2 and (a100 <= 2).all()
    a = run.tenants["team-a"]
    assert len(a.class_quota) == 2
    assert a.reason == ("quota of tenant team-a for class a100 exceeded: 1 GPUs asked, "
                        "2 of 2 in use, 0 left")  # the extender's words
    row = next(r for r in limit_rows(run) if r.tenant == "team-a")
    assert (row.peak_gpus, row.nominal_gpus, row.class_peaks) == (6, 6, "a100 2/2")


def test_tenant_quotas_hold_in_a_crowd_with_every_pod_in_a_class(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    lines = [f"  - {{name: p{k}, tenant: {'xy'[k % 2]}, class: {('a100', 't4')[k % 3 == 0]}, "
             f"cpu: 1, memory: 1Gi, creation: {s}, deletion: {s + int(rng.integers(50, 600))},"
             f" containers: [{{gpu: {int(rng.choice([1, 1, 2]))}}}]}}"
             for k, s in enumerate(int(v) for v in rng.integers(0, 1500, 80))]
    path = tmp_path / "crowd.yaml"
    cluster = EXAMPLE.read_text().split("groups:")[0].replace("classes:\n", (
        "classes:\n  - {name: t4, selector: {matchLabels: {gpupool.io/model: T4}}}\n"))
    path.write_text(cluster + textwrap.dedent("""
        tenants:
          - {name: x, nominal: {gpus: 5}, classes: [{name: a100, nominal: {gpus: 3}}]}
          - {name: y, classes: [{name: t4, nominal: {gpus: 2}}]}
        permissions:
          - {name: y-t4, tenants: [y], gpus: {matchLabels: {gpupool.io/model: T4}}}
        pods:
        """) + "\n".join(lines) + "\n")
    scenario = scenario_from_files(path, path)
    found = tenancy_for(scenario, path, None, None)
    assert found is not None
    run = run_tenants(*found, "best-fit", 1, Campaign(found[0], ("best-fit",), (1,)).config())
    assert max(run.tenant_held["x"]) == 5 and max(run.class_held["x", "a100"]) <= 3
    assert max(run.class_held["y", "t4"]) == 2
    assert run.tenants["y"].nodes <= T4_NODES


# -- the file ------------------------------------------------------------------------------------
def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "t.yaml"
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize(("text", "message"), [
    ("tenants:\n  - {name: a, nominal: {gpus: 1}, clases: []}\n",
     r"t\.yaml:2:\d+: unknown key 'clases' in tenants\[0\] \(did you mean 'classes'\?\)"),
    ("permissions:\n  - name: p\n    tenants: [a]\n    node: {matchLabels: {x: y}}\n",
     r"t\.yaml:4:\d+: unknown key 'node' in permissions\[0\] \(did you mean 'nodes'\?\)"),
    ("tenants: [{name: a}]\n", r"tenants\[0\]: a tenant needs a nominal quota or a class"),
    ("tenants: [{name: a, nominal: {gpus: 1}}, {name: a, nominal: {gpus: 2}}]\n",
     "tenant a appears twice"),
    ("tenants: [{name: a, classes: [{name: c, nominal: {gpus: -1}}]}]\n",
     r"tenants\[0\]\.classes\[0\]\.nominal\.gpus: gpus -1 must be a non-negative"),
    ("permissions: [{name: p, tenants: []}]\n",
     r"permissions\[0\]\.tenants: must be a list of tenant names"),
    ("permissions: [{name: p, tenants: [a], nodes: {matchExpressions: "
     "[{key: k, operator: Near}]}}]\n", r"permissions\[0\]\.nodes: selector: operator 'Near'"),
], ids=["a misspelt tenant key", "a misspelt permission key", "a tenant without a quota",
        "a tenant twice", "a negative class quota", "a permission for nobody",
        "an unknown selector operator"])
def test_bad_tenant_limits_are_refused_naming_the_place(tmp_path: Path, text: str,
                                                        message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        read_tenancy(write(tmp_path, text))


def test_a_tenancy_file_of_tenant_quotas_alone_is_replayed(tmp_path: Path) -> None:
    path = write(tmp_path, "tenants: [{name: team-b, nominal: {gpus: 3}}]\n")
    scenario = scenario_from_files(EXAMPLE, EXAMPLE)
    found = tenancy_for(scenario, EXAMPLE, path, None)
    assert found is not None and found[1].quotas[0].name == "team-b"
    assert found[1].permissions == () and found[1].members == ()
    run = run_tenants(*found, "best-fit", 1, Campaign(found[0], ("best-fit",), (1,)).config())
    assert max(run.tenant_held["team-b"]) == 3 == max(run.held["team-b"])


def test_simulate_prints_and_writes_the_tenant_limits(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--mode", "timed", "--nodes", str(EXAMPLE), "--pods", str(EXAMPLE),
                 "--policy", "best-fit", "--seeds", "1", "--out", str(tmp_path)])
    assert code == 0 and "tenant quotas and permissions" in capsys.readouterr().out
    lines = (tmp_path / "tenants_limits.csv").read_text().splitlines()
    assert lines[0].startswith("run,tenant,pods,waited_permission,waited_tenant_quota")
    assert lines[2].startswith("no borrowing,team-b,10,2,0,0,")


def test_a_class_quota_must_name_a_class_of_the_scenario(tmp_path: Path) -> None:
    path = write(tmp_path, "tenants: [{name: a, classes: [{name: h100, nominal: {gpus: 1}}]}]\n")
    scenario = scenario_from_files(EXAMPLE, EXAMPLE)
    with pytest.raises(InvalidInput, match=r"t\.yaml: tenants\[0\]\.classes\[0\]\.name: "
                       r"resource class h100 does not exist \(known: a100\)"):
        tenancy_for(scenario, EXAMPLE, path, None)


def test_a_tenant_quota_of_gpu_memory_counts_the_gpus_chosen(tmp_path: Path) -> None:
    path = write(tmp_path, "tenants: [{name: team-b, nominal: {gpuMemory: 40Gi}}]\n")
    scenario = scenario_from_files(EXAMPLE, EXAMPLE)
    found = tenancy_for(scenario, EXAMPLE, path, None)
    assert found is not None
    run = run_tenants(*found, "best-fit", 1, Campaign(found[0], ("best-fit",), (1,)).config())
    assert max(run.tenant_held["team-b"]) == 2  # whole GPUs of 16 GiB each: 2 fit in 40 GiB
    assert run.tenants["team-b"].reason == ("quota of tenant team-b exceeded: 16384 MiB of GPU "
                                            "memory asked, 32768 of 40960 in use, 8192 left")
