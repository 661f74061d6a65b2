"""The controller's figures (pure) and its Prometheus metrics: quota per scope, GPUs and
fragmentation per model and pool, pending GPU pods by reason, uncounted decisions,
rounds, leadership; served over real HTTP with /healthz."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpupool.contract import names
from gpupool.controller.figures import PENDING_REASONS, figures, pending_reason
from gpupool.controller.metrics import ControllerMetrics, VerifyTally, serve
from gpupool.controller.observed import observe
from gpupool.core.quota import Amount, Limit
from gpupool.extender.wire.refusals import PREFIX
from gpupool.security.signing import SignatureError
from tests.controller.builders import GIB, device, group, placed_pod, slices, verify

POOL = "gpupool.io/pool"


def cluster() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """n1: 8 free A100s in pool a; n2: 8 A100s in pool b, each 95 % taken; a T4 with no pool."""
    devices = [device("n1", i, labels={POOL: "a"}) for i in range(8)]
    devices += [device("n2", i, labels={POOL: "b"}) for i in range(8)]
    devices.append(device("n3", 0, "T4", 16 * GIB))
    pods = [placed_pod(f"p{i}", "lab" if i < 5 else "vision", "n2", slices("n2", (i, GIB, 95)),
                       group_name="team" if i < 2 else None) for i in range(8)]
    groups = [group("team", nodes=["n2"], quota={"gpus": 4, "memoryMiB": 3 * GIB}),
              group("open", nodes=["n1"])]
    return devices, groups, pods


def test_quota_is_charged_per_group_tenant_and_class_with_group_limits() -> None:
    devices, groups, pods = cluster()
    figs = figures(observe(devices, [], groups, pods, verify), pods)
    by = {(q.scope, q.name): q for q in figs.quotas}
    assert by["group", "team"].used == Amount(2, 2 * GIB, 190)
    assert by["group", "team"].limit == Limit(gpus=4, memory_mib=3 * GIB)
    assert by["group", "open"].used == Amount() and by["group", "open"].limit is None
    assert by["tenant", "lab"].used == Amount(5, 5 * GIB, 475)
    assert by["tenant", "vision"].used == Amount(3, 3 * GIB, 285)
    assert ("class", "a100") not in by  # no pod asks a class


def test_gpus_allocation_and_fragmentation_are_figured_per_model_and_pool() -> None:
    devices, groups, pods = cluster()
    figs = figures(observe(devices, [], groups, pods, verify), pods)
    pools = {(p.model, p.pool): p for p in figs.pools}
    a, b, t4 = pools["A100-SXM4-80GB", "a"], pools["A100-SXM4-80GB", "b"], pools["T4", "none"]
    assert (a.gpus, a.healthy, a.allocated_milli, a.free_milli) == (8, 8, 0, 8000)
    assert a.fragmented_milli == 0  # every task of the workload fits 8 free GPUs
    assert (b.gpus, b.allocated_milli, b.free_milli) == (8, 8 * 950, 8 * 50)
    assert b.fragmented_milli == 8 * 50  # 5 % left per GPU: no task is that small
    # one free GPU: the 2-, 4- and 8-GPU tasks (20 of 100 pods of the built-in workload)
    # cannot run there, so 20 % of its share is fragmented
    assert (t4.gpus, t4.free_milli, t4.fragmented_milli) == (1, 1000, 200)
    assert figs.workload.startswith("built-in")


def test_an_unhealthy_gpu_counts_but_is_neither_healthy_nor_free() -> None:
    devices = [device("n1", 0), device("n1", 1)]
    devices[1]["status"]["health"] = "Unhealthy"
    (fig,) = figures(observe(devices, [], [], []), []).pools
    assert (fig.gpus, fig.healthy, fig.free_milli) == (2, 1, 1000)


def pending(message: str = "", reason: str = "Unschedulable", *, condition: bool = True,
            node: str | None = None, notes: dict[str, str] | None = None,
            gpus: bool = True) -> dict[str, Any]:
    limits = {names.RESOURCE_GPU: "1"} if gpus else {"cpu": "1"}
    pod: dict[str, Any] = {
        "metadata": {"name": "w", "namespace": "lab", "uid": "u1", "annotations": notes or {}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
        "status": {"phase": "Pending"}}
    if node:
        pod["spec"]["nodeName"] = node
    if condition:
        pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False",
                                        "reason": reason, "message": message}]
    return pod


@pytest.mark.parametrize(("pod", "reason"), [
    (pending(condition=False), "waiting"),
    (pending(reason="SchedulingGated"), "gated"),
    (pending(reason="SchedulerError"), "scheduler-error"),
    (pending(f"0/3 nodes are available: 3 {PREFIX}quota of group team exceeded: 1 GPUs "
             "asked, 4 of 4 in use, 0 left."), "quota"),
    (pending(f"0/3 nodes are available: 2 {PREFIX}1 GPUs with 4096 MiB + 10 percent core "
             "needed, 0 have room, 1 Insufficient cpu."), "gpupool"),
    (pending(f"0/3 nodes are available: 1 {PREFIX}making room here: the freed GPU slices "
             "are held for this pod."), "preempting"),
    (pending("0/3 nodes are available: 3 Insufficient cpu."), "other"),
    (pending(node="n1", notes={names.ANNOTATION_ALLOCATION: "{}",
                               names.ANNOTATION_PHASE: names.PHASE_FAILED}),
     "allocation-failed"),
    (pending(node="n1"), None),  # bound, waiting for kubelet
    (pending("x", gpus=False), None),  # asks no GPU
])
def test_a_pending_gpu_pod_is_counted_under_what_kube_scheduler_or_gpupool_said(
        pod: dict[str, Any], reason: str | None) -> None:
    assert pending_reason(pod) == reason


def test_a_running_or_deleting_pod_is_not_pending() -> None:
    running = pending()
    running["status"]["phase"] = "Running"
    deleting = pending()
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert pending_reason(running) is None and pending_reason(deleting) is None


def test_unverified_decisions_are_tallied_by_reason() -> None:
    def refuse(uid: str, *_: Any) -> str:
        raise SignatureError("no", {"u1": SignatureError.UNSIGNED, "u2": SignatureError.MISMATCH,
                                    "u3": SignatureError.UNKNOWN_KEY}.get(uid, "malformed"))
    tally = VerifyTally(refuse)
    for uid in ("u1", "u2", "u3", "u4", "u1"):
        with pytest.raises(SignatureError):
            tally(uid, "ns", "n", {}, None)
    assert tally.take() == {"unsigned": 2, "invalid": 2, "unknown-key": 1}
    assert tally.take() == {}


def scrape(metrics: ControllerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client import generate_latest
    out = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for s in family.samples:
            out[s.name, tuple(sorted(s.labels.items()))] = s.value
    return out


def test_a_round_sets_every_figure_and_a_follower_clears_them() -> None:
    devices, groups, pods = cluster()
    observed = observe(devices, [], groups, [*pods, pending(f"3 {PREFIX}quota of x")], verify)
    m = ControllerMetrics()
    m.round_done(figures(observed, [*pods, pending(f"3 {PREFIX}quota of x")],
                         {"invalid": 1}), observed, 0.03, failures=1, now_s=1234.0)
    got = scrape(m)
    assert got["gpupool_controller_quota_used_gpus", (("name", "team"), ("scope", "group"))] == 2
    assert got["gpupool_controller_quota_limit_memory_mib",
               (("name", "team"), ("scope", "group"))] == 3 * GIB
    assert ("gpupool_controller_quota_limit_core_pct",
            (("name", "team"), ("scope", "group"))) not in got  # not limited
    assert got["gpupool_controller_gpus_fragmented",
               (("model", "A100-SXM4-80GB"), ("pool", "b"))] == pytest.approx(0.4)
    assert got["gpupool_controller_gpus_allocated",
               (("model", "A100-SXM4-80GB"), ("pool", "b"))] == pytest.approx(7.6)
    assert got["gpupool_controller_pending_pods", (("reason", "quota"),)] == 1
    assert {got["gpupool_controller_pending_pods", (("reason", r),)]
            for r in PENDING_REASONS if r != "quota"} == {0}
    assert got["gpupool_controller_uncounted_decisions", (("reason", "invalid"),)] == 1
    assert got["gpupool_controller_reconciles_total", (("result", "failed"),)] == 1
    assert got["gpupool_controller_write_failures_total", ()] == 1
    assert got["gpupool_controller_reconcile_seconds_count", ()] == 1
    assert got["gpupool_controller_last_reconcile_timestamp_seconds", ()] == 1234.0
    m.clear_world()
    left = {name for name, _ in scrape(m)}
    assert not any(n.startswith(("gpupool_controller_quota", "gpupool_controller_gpus",
                                 "gpupool_controller_pending")) for n in left)
    assert "gpupool_controller_reconciles_total" in left  # the process's own counters stay


def test_a_series_that_disappears_from_the_cluster_disappears_from_the_metrics() -> None:
    devices, groups, pods = cluster()
    m = ControllerMetrics()
    for shown in (pods, pods[:2]):
        observed = observe(devices, [], groups, shown, verify)
        m.round_done(figures(observed, shown), observed, 0.01, 0)
    tenants = {dict(labels)["name"] for name, labels in scrape(m)
               if name == "gpupool_controller_quota_used_gpus" and
               dict(labels)["scope"] == "tenant"}
    assert tenants == {"lab"}  # vision's pods are gone


def test_leadership_says_who_leads() -> None:
    m = ControllerMetrics()
    m.leadership(False, "ctl-b_1", 3)
    m.leadership(False, "ctl-a_2", 4)
    got = scrape(m)
    assert got["gpupool_controller_is_leader", ()] == 0
    assert got["gpupool_controller_leader_info", (("holder", "ctl-a_2"),)] == 1
    assert ("gpupool_controller_leader_info", (("holder", "ctl-b_1"),)) not in got
    assert got["gpupool_controller_lease_transitions", ()] == 4


def test_metrics_and_healthz_are_served_over_http() -> None:
    m = ControllerMetrics()
    m.leadership(True, "me", 0)
    healthy = [True]
    server = serve(m, "127.0.0.1", 0, lambda: healthy[0])
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
            assert b"gpupool_controller_is_leader 1.0" in r.read()
        with urllib.request.urlopen(base + "/healthz", timeout=5) as r:
            assert r.status == 200
        healthy[0] = False
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(base + "/healthz", timeout=5)
        assert err.value.code == 500
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(base + "/other", timeout=5)
        assert err.value.code == 404
    finally:
        server.shutdown()
        server.server_close()


def test_gpus_whose_node_agent_went_quiet_or_that_are_isolated_are_counted() -> None:
    from gpupool.controller.figures import DeviceMemo, Heartbeats

    devices = [device("n1", i, labels={POOL: "a"}) for i in range(3)]
    devices[0]["status"]["heartbeatTime"] = "2026-01-01T00:00:00Z"  # 1,000 s ago
    devices[1]["status"]["heartbeatTime"] = "2026-01-01T00:16:00Z"  # 40 s ago
    devices[2]["status"]["isolation"] = {"state": names.DEVICE_ISOLATED, "reason": "over-use",
                                         "pods": ["lab/p"]}
    now = 1767225600.0 + 1000  # 2026-01-01T00:16:40Z
    beats = Heartbeats(DeviceMemo().read(devices), now, stale_after_s=120)
    (fig,) = figures(observe(devices, [], [], []), [], heartbeats=beats).pools
    assert (fig.stale, fig.isolated) == (1, 1)
    assert (fig.model, fig.pool, fig.gpus) == ("A100-SXM4-80GB", "a", 3)
