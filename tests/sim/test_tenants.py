"""Tenants in the simulator: the example scenario borrows, then the lender reclaims and gets
its nominal back; priorities inside a quota; quotas are never passed at any instant; the
reports; the YAML and --tenants readers, and their errors."""

from __future__ import annotations

import csv
import textwrap
from pathlib import Path

import numpy as np
import pytest

from gpupool.cli.main import main
from gpupool.core.errors import InvalidInput
from gpupool.core.policies.config import PolicyConfig
from gpupool.sim.campaign import Campaign
from gpupool.sim.scenario import Scenario
from gpupool.sim.sources import scenario_from_files
from gpupool.sim.tenants import Tenancy, hashed_tenant, read_tenancy, tenancy_for, with_tenants
from gpupool.sim.tenants_replay import GRACE_S, TenantRun, run_tenants
from gpupool.sim.tenants_report import rows, total_mean_gpus
from tests.sim.paths import DATA, REPO

EXAMPLE = REPO / "examples" / "tenants.yaml"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def example() -> tuple[Scenario, Tenancy, PolicyConfig]:
    scenario = scenario_from_files(EXAMPLE, EXAMPLE)
    found = tenancy_for(scenario, EXAMPLE, None, None)
    assert found is not None
    scenario, tenancy = found
    return scenario, tenancy, Campaign(scenario, ("best-fit",), (1,)).config()


def at(run: TenantRun, key: str, t: float, what: str = "held") -> int:
    """The value of ``key``'s curve at time ``t`` (the step function)."""
    curve = run.held if what == "held" else run.borrowed
    i = int(np.searchsorted(np.asarray(run.times), t, side="right")) - 1
    return curve[key][i]


def test_the_example_borrows_then_the_lender_reclaims_its_nominal() -> None:
    scenario, tenancy, config = example()
    run = run_tenants(scenario, tenancy, "best-fit", 1, config)
    assert at(run, "team-b", 50) == 6 and at(run, "team-b", 50, "borrowed") == 2
    a, b = run.tallies["team-a"], run.tallies["team-b"]
    assert (a.reclaims, b.reclaimed) == (2, 2)  # team-b's two borrowed pods, taken back
    assert at(run, "team-a", 100 + 2 * GRACE_S) == 4  # the lender has its nominal back
    assert at(run, "team-b", 100 + 2 * GRACE_S, "borrowed") == 0
    assert max(a.back_s) == GRACE_S  # each reclaim: the victims' grace period, no more
    assert at(run, "team-b", 1200, "borrowed") == 2  # when team-a is done, it borrows again
    assert run.waiting_at_end == {"team-a": 0, "team-b": 0}


def test_an_urgent_pod_preempts_its_own_groups_pod_of_lower_priority() -> None:
    scenario, tenancy, config = example()
    run = run_tenants(scenario, tenancy, "best-fit", 1, config)
    assert run.tallies["team-a"].preempted == 1 and run.tallies["team-b"].preempted == 0
    assert at(run, "team-a", 400 + GRACE_S) == 4  # the urgent pod runs within the quota


def test_borrowing_raises_the_allocation_against_the_same_quotas_without_it() -> None:
    scenario, tenancy, config = example()
    with_cohort = run_tenants(scenario, tenancy, "best-fit", 1, config)
    alone = run_tenants(scenario, tenancy.without_cohorts(), "best-fit", 1, config)
    assert total_mean_gpus(with_cohort) > total_mean_gpus(alone)
    assert alone.tallies["team-a"].reclaims == 0
    assert max(alone.held["team-b"]) == 4  # never beyond its nominal
    b = {r.run: r for r in rows(with_cohort) + rows(alone) if r.group == "team-b"}
    assert b["borrowing"].wait_p95_s < b["no borrowing"].wait_p95_s
    assert b["borrowing"].borrowed_share > 0 == b["no borrowing"].borrowed_share


CROWD = textwrap.dedent("""
    nodes:
      - name: n-{i}
        replicas: 3
        cpu: 64
        memory: 256Gi
        gpus: {count: 4, model: A100, memory: 40Gi}
    groups:
      - {name: a, cohort: c, nominal: {gpus: 3}, borrowingLimit: {gpus: 2}, weight: 1}
      - {name: b, cohort: c, nominal: {gpus: 5}, lendingLimit: {gpus: 2}, weight: 2}
      - {name: d, cohort: c, nominal: {gpus: 4}, weight: 1}
    pods:
""")


def crowd(tmp_path: Path, pods: int = 60) -> Path:
    rng = np.random.default_rng(7)
    lines = []
    for k in range(pods):
        start = float(rng.integers(0, 2000))
        gpus = int(rng.choice([1, 1, 2, 4]))
        lines.append(f"  - {{name: p{k}, tenant: {'abd'[k % 3]}, priority: {k % 3}, cpu: 1, "
                     f"memory: 1Gi, creation: {start}, deletion: {start + rng.integers(50, 900)},"
                     f" containers: [{{gpu: {gpus}}}]}}")
    path = tmp_path / "crowd.yaml"
    path.write_text(CROWD + "\n".join(lines) + "\n")
    return path


def test_no_group_ever_passes_its_nominal_plus_borrowing_limit_or_the_lending_limits(
        tmp_path: Path) -> None:
    path = crowd(tmp_path)
    scenario = scenario_from_files(path, path)
    found = tenancy_for(scenario, path, None, None)
    assert found is not None
    scenario, tenancy = found
    run = run_tenants(scenario, tenancy, "best-fit", 1,
                      Campaign(scenario, ("best-fit",), (1,)).config())
    held = {k: np.asarray(v) for k, v in run.held.items()}
    assert held["a"].max() <= 3 + 2  # nominal + borrowing limit
    # the cohort's pool is 3 + 2 + 4: b lends only 2 of its 5, so its first 3 are its own
    draws = held["a"] + np.maximum(held["b"] - 3, 0) + held["d"]
    assert draws.max() <= 9
    assert max(max(t.reclaims for t in run.tallies.values()),
               max(t.preempted for t in run.tallies.values())) > 0  # it was exercised
    assert sum(t.pods for t in run.tallies.values()) == 60
    assert sum(len(t.waits) for t in run.tallies.values()) + sum(
        run.waiting_at_end.values()) >= 60


def test_simulate_writes_the_tenant_table_csvs_and_plot(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    out = tmp_path / "out"
    code = main(["simulate", "--mode", "timed", "--nodes", str(EXAMPLE), "--pods", str(EXAMPLE),
                 "--policy", "best-fit", "--seeds", "1", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "team-a" in printed and "tenants.png" in printed
    with (out / "tenants.csv").open() as handle:
        table = list(csv.DictReader(handle))
    assert [(r["run"], r["group"]) for r in table] == [  # its cohort shares fairly
        ("borrowing", "team-a"), ("borrowing", "team-b"),
        ("borrowing, no fair sharing", "team-a"), ("borrowing, no fair sharing", "team-b"),
        ("no borrowing", "team-a"), ("no borrowing", "team-b")]
    assert table[0]["reclaims"] == "2" and table[1]["reclaimed"] == "2"
    with (out / "tenants_timeline.csv").open() as handle:
        assert next(csv.reader(handle)) == ["run", "time_s", "group", "held_gpus",
                                            "borrowed_gpus"]
    assert (out / "tenants.png").read_bytes().startswith(PNG_MAGIC)


def test_tenants_need_timed_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--nodes", str(EXAMPLE), "--pods", str(EXAMPLE), "--tenants", "3",
                 "--out", str(tmp_path)])
    assert code == 2 and "tenants are replayed in time: add --mode timed" in \
        capsys.readouterr().err


# -- readers ------------------------------------------------------------------------------------
def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "t.yaml"
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize(("text", "message"), [
    ("groups: [{name: a, nominal: {gpus: 1}, tenants: [x]}, "
     "{name: b, nominal: {gpus: 1}, tenants: [x]}]",
     "groups\\[1\\].tenants: tenant x is already in group a"),
    ("groups: [{name: a, nominal: {}}]", "groups\\[0\\].nominal: a group needs a nominal"),
    ("groups: [{name: a, nominal: {gpus: 1}}, {name: a, nominal: {gpus: 2}}]",
     "group a appears twice"),
    ("cohorts: [{name: lonely}]\ngroups: [{name: a, nominal: {gpus: 1}}]",
     "cohort lonely has no group"),
    ("groups: [{name: a, nominal: {gpus: -1}}]",
     "groups\\[0\\].nominal.gpus: gpus -1 must be a non-negative whole number"),
    ("groups: [{name: a, nominal: {gpus: 1}, weight: -2}]", "weight must be a number >= 0"),
    ("groups: [{name: a, nominal: {gpus: 1}, borowingLimit: {gpus: 1}}]",
     "unknown key 'borowingLimit' in groups\\[0\\] \\(did you mean 'borrowingLimit'\\?\\)"),
    ("pods: [{name: p, tenant: a, priority: high}]\ngroups: [{name: a, nominal: {gpus: 1}}]",
     "priority.*a whole number"),
], ids=["a tenant in two groups", "a group without a nominal quota", "a group twice",
        "a cohort no group joins", "a negative quota", "a negative weight", "a misspelt key",
        "a priority that is not a number"])
def test_bad_tenancy_is_refused_naming_the_place(tmp_path: Path, text: str,
                                                 message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        read_tenancy(write(tmp_path, text))


@pytest.mark.parametrize(("text", "line", "entry"), [
    ("groups:\n  - name: a\n    nominal:\n      gpus: lots\n", 4, "groups[0].nominal.gpus"),
    ("groups:\n  - {name: a, nominal: {gpus: 1}}\n  - name: b\n    weight: -1\n"
     "    nominal: {gpus: 1}\n", 3, "groups[1]"),
    ("tenants:\n  - name: t\n    classes:\n      - name: c\n        nominal: {gpus: -1}\n",
     5, "tenants[0].classes[0].nominal.gpus"),
], ids=["a bad quantity", "a bad weight", "a bad class quota"])
def test_a_bad_tenancy_entry_is_said_at_its_line(tmp_path: Path, text: str, line: int,
                                                 entry: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InvalidInput) as caught:
        read_tenancy(path)
    assert str(caught.value).startswith(f"{path}:{line}: {entry}: ")


def test_a_tenancy_file_needs_groups(tmp_path: Path) -> None:
    path = write(tmp_path, "cohorts: []\n")
    scenario = scenario_from_files(EXAMPLE, EXAMPLE)
    with pytest.raises(InvalidInput, match="no groups"):
        tenancy_for(scenario, EXAMPLE, path, None)


def test_hashed_tenants_are_stable_and_spread() -> None:
    assert hashed_tenant("openb-pod-0001", 3) == hashed_tenant("openb-pod-0001", 3)
    spread = {hashed_tenant(f"pod-{k}", 3) for k in range(50)}
    assert spread == {"tenant-0", "tenant-1", "tenant-2"}


def test_trace_pods_get_tenants_by_hash_or_by_qos(tmp_path: Path) -> None:
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,qos,creation_time,"
                    "deletion_time\np1,1000,1024,1,1000,LS,0,10\np2,1000,1024,1,500,BE,5,20\n")
    scenario = scenario_from_files(DATA / "one_gpu_nodes.csv", pods)
    by_qos = with_tenants(scenario, "qos", pods)
    assert [p.request.tenant for p in by_qos.pods] == ["ls", "be"]
    by_hash = with_tenants(scenario, "2", pods)
    assert [p.request.tenant for p in by_hash.pods] == [hashed_tenant("p1", 2),
                                                          hashed_tenant("p2", 2)]
    with pytest.raises(InvalidInput, match="--tenants must be a number of tenants or qos"):
        with_tenants(scenario, "many", pods)


FAIR = textwrap.dedent("""
    nodes:
      - name: n-{i}
        replicas: 3
        cpu: 64
        memory: 256Gi
        gpus: {count: 4, model: A100, memory: 40Gi}
    cohorts:
      - {name: c, fairSharing: FAIR}
    groups:
      - {name: idle, cohort: c, nominal: {gpus: 8}}
      - {name: light, cohort: c, nominal: {gpus: 2}, weight: 1}
      - {name: heavy, cohort: c, nominal: {gpus: 2}, weight: 3}
    pods:
      - {name: "l-{i}", replicas: 10, tenant: light, creation: 0, deletion: 100, cpu: 1,
         memory: 1Gi, containers: [{gpu: 1}]}
      - {name: "h-{i}", replicas: 10, tenant: heavy, creation: 0, deletion: 100, cpu: 1,
         memory: 1Gi, containers: [{gpu: 1}]}
""")


@pytest.mark.parametrize(("fair", "light", "heavy"), [("true", 4, 8), ("false", 10, 2)],
                         ids=["fair sharing divides the idle 8 GPUs 1:3 by weight",
                              "without it, arrival order: the first comer takes what it can"])
def test_fair_sharing_divides_idle_capacity_by_weight(tmp_path: Path, fair: str, light: int,
                                                       heavy: int) -> None:
    path = tmp_path / "fair.yaml"
    path.write_text(FAIR.replace("FAIR", fair))
    scenario = scenario_from_files(path, path)
    found = tenancy_for(scenario, path, None, None)
    assert found is not None
    scenario, tenancy = found
    run = run_tenants(scenario, tenancy, "best-fit", 1,
                      Campaign(scenario, ("best-fit",), (1,)).config())
    assert (at(run, "light", 0), at(run, "heavy", 0)) == (light, heavy)
