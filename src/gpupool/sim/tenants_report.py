"""What a replay with tenants reports, per group (or tenant without a group):

* ``tenants.csv`` — one row per run (with borrowing; with a cohort that shares fairly, also
  the same cohorts first come first served; and the same quotas without cohorts) and group:
  nominal GPUs, pods, started, still waiting at the end, wait p50/p95 (s), pods preempted
  inside the quota, pods reclaimed from it, reclaims it caused, the longest time from a
  reclaim to its pod running, GPUs held (time-weighted mean and peak), the borrowed share
  (borrowed GPU-seconds over held GPU-seconds), and its pods reclaimed for fairness and
  the reclaims for fairness it caused;
* ``tenants_timeline.csv`` — per run, instant and group: GPUs held and borrowed;
* ``tenants.png`` — GPUs held per group over time, its nominal dashed, one panel per run;
* ``tenants_limits.csv`` — per run and tenant with a tenant quota or a permission: pods,
  pods that waited because of its permissions, its tenant quota, its class quotas, the
  peak GPUs it held against its quota (and per class), the nodes it ran on, the first
  reason it was held back (written only when some tenant has such limits).

GPUs are counted as quota counts them: every GPU a pod touches counts 1. Means run from the
first to the last arrival (the drain afterwards is left out), as in the timed mode.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import astuple, dataclass, fields
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from rich.table import Table

from gpupool.sim.report import _atomic
from gpupool.sim.tenants_replay import TenantRun

TENANTS, TIMELINE, PLOT = "tenants.csv", "tenants_timeline.csv", "tenants.png"
LIMITS = "tenants_limits.csv"


@dataclass(frozen=True, slots=True)
class TenantRow:
    """One group's figures in one run."""

    run: str
    group: str
    nominal_gpus: int | None
    pods: int
    started: int
    waiting_at_end: int
    wait_p50_s: float
    wait_p95_s: float
    preempted: int
    reclaimed: int
    reclaims: int
    reclaim_to_running_max_s: float | None
    mean_gpus: float
    peak_gpus: int
    borrowed_share: float
    fair_reclaimed: int = 0
    fair_reclaims: int = 0


@dataclass(frozen=True, slots=True)
class LimitRow:
    """What one tenant's own limits held back in one run."""

    run: str
    tenant: str
    pods: int
    waited_permission: int
    waited_tenant_quota: int
    waited_class_quota: int
    nominal_gpus: int | None
    peak_gpus: int | None
    class_peaks: str  # "<class> <peak>/<nominal>", per class quota
    nodes: int
    reason: str


def limit_rows(run: TenantRun) -> list[LimitRow]:
    out = []
    for tenant, t in run.tenants.items():
        held = run.tenant_held.get(tenant)
        classes = "; ".join(
            f"{c} {max(run.class_held[tenant, c], default=0)}/{'-' if n is None else n}"
            for c, n in t.class_gpus.items())
        out.append(LimitRow(label(run), tenant, t.pods, len(t.permission),
                            len(t.tenant_quota), len(t.class_quota), t.nominal_gpus,
                            None if held is None else max(held, default=0), classes,
                            len(t.nodes), t.reason))
    return out


def limits_csv(runs: Sequence[TenantRun]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([f.name for f in fields(LimitRow)])
    for run in runs:
        for row in limit_rows(run):
            writer.writerow(["" if v is None else v for v in astuple(row)])
    return buf.getvalue()


LIMITS_OPTIONAL = ("class peak/nominal", "class quota", "nodes")
"""The columns of ``limits_table`` a narrow screen may leave out, the first first."""


def limits_table(run: TenantRun, title: str) -> Table:
    """One run's tenants with a tenant quota or a permission, for the terminal."""
    out = Table(title=f"{title}, {label(run)}: tenant quotas and permissions",
                caption="waited: pods held back at least once, by their permissions (no "
                        "room on the GPUs they may use while other GPUs had room), their "
                        "tenant quota, their class quota")
    out.add_column("tenant", no_wrap=True)
    for name in ("pods", "waited: permission", "tenant quota", "class quota",
                 "peak/nominal GPUs", "class peak/nominal", "nodes"):
        out.add_column(name, justify="right")
    for r in limit_rows(run):
        nominal = "-" if r.nominal_gpus is None else str(r.nominal_gpus)
        peak = "-" if r.peak_gpus is None else f"{r.peak_gpus}/{nominal}"
        out.add_row(r.tenant, str(r.pods), str(r.waited_permission),
                    str(r.waited_tenant_quota), str(r.waited_class_quota), peak,
                    r.class_peaks or "-", str(r.nodes))
    return out


def label(run: TenantRun) -> str:
    return run.variant or ("borrowing" if run.borrowing else "no borrowing")


def rows(run: TenantRun) -> list[TenantRow]:
    times = np.asarray(run.times, np.float64)
    out = []
    for key in run.keys:
        t = run.tallies[key]
        held = np.asarray(run.held[key], np.float64)
        borrowed = np.asarray(run.borrowed[key], np.float64)
        waits = np.asarray(t.waits or [np.nan])
        out.append(TenantRow(
            label(run), key, run.nominal_gpus[key], t.pods, len(t.waits),
            run.waiting_at_end[key], _pct(waits, 50), _pct(waits, 95), t.preempted,
            t.reclaimed, t.reclaims, round(max(t.back_s), 3) if t.back_s else None,
            round(time_integral(times, held, run.last_arrival) / _span(times, run), 3),
            int(held.max()) if held.size else 0,
            round(_ratio(time_integral(times, borrowed, run.last_arrival),
                         time_integral(times, held, run.last_arrival)), 4),
            t.fair_reclaimed, t.fair_reclaims))
    return out


def total_mean_gpus(run: TenantRun) -> float:
    """GPUs held by every group together, time-weighted mean."""
    times = np.asarray(run.times, np.float64)
    total = np.sum([np.asarray(run.held[k], np.float64) for k in run.keys], axis=0)
    return round(time_integral(times, total, run.last_arrival) / _span(times, run), 3)


def time_integral(times: np.ndarray, values: np.ndarray, until: float) -> float:
    """The step function's integral from the first instant to ``until``."""
    if times.size == 0:
        return 0.0
    ends = np.minimum(np.append(times[1:], until), until)
    return float(np.sum(values * np.maximum(ends - times, 0.0)))


def _span(times: np.ndarray, run: TenantRun) -> float:
    return max(run.last_arrival - float(times[0]), 1e-9) if times.size else 1.0


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else 0.0


def _pct(values: np.ndarray, q: int) -> float:
    return round(float(np.nanpercentile(values, q)), 3) if np.isfinite(values).any() else 0.0


# -- files ---------------------------------------------------------------------------------------
def tenants_csv(runs: Sequence[TenantRun]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([f.name for f in fields(TenantRow)])
    for run in runs:
        for row in rows(run):
            writer.writerow(["" if v is None else v for v in astuple(row)])
    return buf.getvalue()


def timeline_csv(runs: Sequence[TenantRun]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["run", "time_s", "group", "held_gpus", "borrowed_gpus"])
    for run in runs:
        for i, t in enumerate(run.times):
            for key in run.keys:
                writer.writerow([label(run), t, key, run.held[key][i], run.borrowed[key][i]])
    return buf.getvalue()


def plot_png(runs: Sequence[TenantRun]) -> bytes:
    fig = Figure(figsize=(10, 3.2 * len(runs)), tight_layout=True)
    axes = fig.subplots(len(runs), 1, squeeze=False)[:, 0]
    for ax, run in zip(axes, runs, strict=True):
        for n, key in enumerate(run.keys):
            color = f"C{n % 10}"
            ax.step(run.times, run.held[key], where="post", color=color, label=key)
            nominal = run.nominal_gpus[key]
            if nominal is not None:
                ax.axhline(nominal, color=color, linestyle="--", linewidth=0.8)
        ax.set_title(f"GPUs held per group, {label(run)} (dashed: nominal)")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("GPUs")
        ax.legend(loc="upper right", fontsize="small")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def write_tenants(out: Path, runs: Sequence[TenantRun]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in ((TENANTS, tenants_csv(runs).encode()),
                       (TIMELINE, timeline_csv(runs).encode()), (PLOT, plot_png(runs))):
        _atomic(out / name, data)
        written.append(out / name)
    if any(run.tenants for run in runs):
        _atomic(out / LIMITS, limits_csv(runs).encode())
        written.append(out / LIMITS)
    return written


TABLE_OPTIONAL = ("fair: reclaimed/reclaims", "reclaims", "reclaimed", "preempted")
"""The columns of ``table`` a narrow screen may leave out, the first first (tenants.csv
holds them all)."""


def table(run: TenantRun, title: str) -> Table:
    """One run's figures per group, for the terminal."""
    out = Table(title=f"{title}, {label(run)}",
                caption="queued: still waiting at the end; waits: of the pods that started; "
                        "GPUs: time-weighted mean from the first to the last arrival; "
                        "borrowed: share of the GPU-seconds held beyond the nominal")
    width = max((len(k) for k in run.keys), default=5)
    out.add_column("group", no_wrap=True, min_width=width)
    for name in ("nominal", "pods", "queued", "wait p50/p95 s", "preempted", "reclaimed",
                 "reclaims", "fair: reclaimed/reclaims", "GPUs", "peak", "borrowed"):
        out.add_column(name, justify="right")
    for r in rows(run):
        out.add_row(r.group, "-" if r.nominal_gpus is None else str(r.nominal_gpus),
                    str(r.pods), str(r.waiting_at_end), f"{r.wait_p50_s:g} / {r.wait_p95_s:g}",
                    str(r.preempted), str(r.reclaimed), str(r.reclaims),
                    f"{r.fair_reclaimed}/{r.fair_reclaims}", f"{r.mean_gpus:.2f}",
                    str(r.peak_gpus), f"{100 * r.borrowed_share:.1f} %")
    out.add_row("all groups", "", "", "", "", "", "", "", "", f"{total_mean_gpus(run):.2f}",
                "", "")
    return out
