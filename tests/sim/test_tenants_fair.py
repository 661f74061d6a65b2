"""Fair sharing in the replay with tenants, as the running system does it: a group within
its fair share takes borrowed capacity back from a group beyond its own (reclaim for
fairness, counted apart from reclaims of lent capacity), the group evicted does not take it
back in turn, and the same cohort first come first served keeps what it took first."""

from __future__ import annotations

import csv
import textwrap
from pathlib import Path

import pytest

from gpupool.cli.main import main
from gpupool.sim.campaign import Campaign, SimMode
from gpupool.sim.sources import scenario_from_files
from gpupool.sim.synthetic import synthetic_scenario
from gpupool.sim.tenants import tenancy_for
from gpupool.sim.tenants_replay import GRACE_S, TenantRun, run_tenants
from gpupool.sim.tenants_report import rows
from tests.sim.paths import REPO
from tests.sim.test_tenants import at

LATE = textwrap.dedent("""
    # 12 GPUs; "idle" lends its 8; "early" borrows all it can at t=0, "late" arrives at 100
    nodes:
      - name: n-{i}
        replicas: 3
        cpu: 64
        memory: 256Gi
        gpus: {count: 4, model: A100, memory: 40Gi}
    cohorts:
      - {name: c, fairSharing: true}
    groups:
      - {name: idle, cohort: c, nominal: {gpus: 8}}
      - {name: early, cohort: c, nominal: {gpus: 2}}
      - {name: late, cohort: c, nominal: {gpus: 2}, weight: WEIGHT}
    pods:
      - {name: "e-{i}", replicas: 10, tenant: early, creation: 0, deletion: 1000, cpu: 1,
         memory: 1Gi, containers: [{gpu: 1}]}
      - {name: "l-{i}", replicas: 10, tenant: late, creation: 100, deletion: 1100, cpu: 1,
         memory: 1Gi, containers: [{gpu: 1}]}
""")


def replay(tmp_path: Path, fair: bool, weight: int = 1) -> TenantRun:
    path = tmp_path / "late.yaml"
    path.write_text(LATE.replace("WEIGHT", str(weight)))
    scenario = scenario_from_files(path, path)
    found = tenancy_for(scenario, path, None, None)
    assert found is not None
    scenario, tenancy = found
    if not fair:
        tenancy = tenancy.without_fair_sharing()
    return run_tenants(scenario, tenancy, "best-fit", 1,
                       Campaign(scenario, ("best-fit",), (1,)).config())


@pytest.mark.parametrize(("weight", "late", "early"), [(1, 6, 6), (3, 8, 4)],
                         ids=["equal weights: the 8 lent GPUs split 4 and 4",
                              "weights 3 to 1: 6 and 2"])
def test_a_group_within_its_fair_share_reclaims_from_one_beyond_it(
        tmp_path: Path, weight: int, late: int, early: int) -> None:
    run = replay(tmp_path, fair=True, weight=weight)
    assert at(run, "early", 99) == 10  # 2 of its own, 8 borrowed
    settled = 100 + (10 - early) * GRACE_S + 1  # one eviction per grace period
    assert (at(run, "late", settled), at(run, "early", settled)) == (late, early)
    e, lt = run.tallies["early"], run.tallies["late"]
    assert (e.fair_reclaimed, lt.fair_reclaims) == (10 - early, 10 - early) != (0, 0)
    assert (lt.fair_reclaimed, e.fair_reclaims) == (0, 0)  # no taking turns
    assert (e.reclaimed, lt.reclaims) == (0, 0)  # late's nominal was idle: no plain reclaim
    assert run.waiting_at_end == {"idle": 0, "early": 0, "late": 0}


def test_first_come_first_served_keeps_what_the_early_group_took(tmp_path: Path) -> None:
    run = replay(tmp_path, fair=False)
    assert (at(run, "late", 400), at(run, "early", 400)) == (2, 10)
    assert all(t.fair_reclaimed == t.fair_reclaims == 0 for t in run.tallies.values())
    fair = {r.group: r for r in rows(replay(tmp_path, fair=True))}
    first = {r.group: r for r in rows(run)}
    assert fair["late"].wait_p50_s < first["late"].wait_p50_s  # fair sharing serves it


def test_simulate_reports_fair_sharing_on_and_off_with_reclaims_for_fairness(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "late.yaml"
    path.write_text(LATE.replace("WEIGHT", "1"))
    out = tmp_path / "out"
    assert main(["simulate", "--mode", "timed", "--nodes", str(path), "--pods", str(path),
                 "--policy", "best-fit", "--seeds", "1", "--out", str(out)]) == 0
    assert "fair" in capsys.readouterr().out
    with (out / "tenants.csv").open() as handle:
        table = {(r["run"], r["group"]): r for r in csv.DictReader(handle)}
    assert {run for run, _ in table} == {"borrowing", "borrowing, no fair sharing",
                                         "no borrowing"}
    assert (table["borrowing", "early"]["fair_reclaimed"],
            table["borrowing", "late"]["fair_reclaims"]) == ("4", "4")
    assert table["borrowing, no fair sharing", "late"]["fair_reclaims"] == "0"


def test_the_fair_share_example_serves_the_heavier_weight_sooner_on_the_builtin_workload(
        ) -> None:
    """examples/tenants-fairshare.yaml on the built-in synthetic workload (--tenants 3):
    tenant-2 (weight 3) waits less with fair sharing than first come first served, and
    tenant-1 (weight 1) more; reclaims for fairness happen, only from the borrowers."""
    example = REPO / "examples" / "tenants-fairshare.yaml"
    found = tenancy_for(synthetic_scenario(), None, example, "3")
    assert found is not None
    scenario, tenancy = found
    config = Campaign(scenario, ("best-fit",), (42,), SimMode.TIMED).config()
    fair, first = (
        {r.group: r for r in rows(run_tenants(scenario, t, "best-fit", 42, config))}
        for t in (tenancy, tenancy.without_fair_sharing()))
    assert fair["tenant-2"].wait_p95_s < first["tenant-2"].wait_p95_s
    assert fair["tenant-1"].wait_p95_s > first["tenant-1"].wait_p95_s
    assert fair["tenant-2"].fair_reclaims > 0 and fair["tenant-0"].fair_reclaimed == 0
    assert sum(r.fair_reclaims for r in first.values()) == 0
