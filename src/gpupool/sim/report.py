"""What a simulation leaves in its output folder.

* ``summary.json`` — the scenario, per run (``policy``, ``seed``,
  ``unallocated_gpu_pct``, failures by kind and reason, decision times, ...)
  and per policy (``mean_unallocated_gpu_pct``, ``std_unallocated_gpu_pct``, ...);
* ``curves.csv`` — per policy and seed, allocation % against arrived demand %
  (protocol) or against time (timed);
* ``allocation.png`` — the mean curve of every policy.

Each file is written to a temporary name and renamed, so a reader never sees
half a file.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from gpupool.sim.campaign import Campaign, PolicyStats, Run, SimMode
from gpupool.sim.protocol import ProtocolRun
from gpupool.sim.timed import TimedRun

SUMMARY, CURVES, PLOT = "summary.json", "curves.csv", "allocation.png"


def summary(campaign: Campaign, runs: Sequence[Run], stats: Sequence[PolicyStats],
            wall_s: float) -> dict[str, object]:
    s = campaign.scenario
    return {
        "mode": campaign.mode.value,
        "scenario": s.name,
        "nodes": len(s.nodes),
        "gpus": s.gpu_capacity_milli // 1000,
        "pods": len(s.pods),
        "trace_gpu_demand_pct": round(100.0 * s.gpu_demand_milli / s.gpu_capacity_milli, 4),
        "inflate": campaign.inflate if campaign.mode is SimMode.PROTOCOL else None,
        "seeds": list(campaign.seeds),
        "weights": dict(campaign.weights),
        "nodes_to_score": campaign.nodes_to_score,
        "learn_every": campaign.learn_every,
        "wall_s": round(wall_s, 3),
        "policies": {p.policy: {k: v for k, v in dataclasses.asdict(p).items() if k != "policy"}
                     for p in stats},
        "runs": [_run_row(r) for r in runs],
    }


def _run_row(run: Run) -> dict[str, object]:
    row = run.summary()
    if isinstance(run, TimedRun):
        row["unallocated_gpu_pct"] = None  # the headline belongs to the protocol
    return row


def write_all(out: Path, campaign: Campaign, runs: Sequence[Run],
              stats: Sequence[PolicyStats], wall_s: float) -> list[Path]:
    """Write the three outputs into ``out`` (created if needed); returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(summary(campaign, runs, stats, wall_s), indent=2) + "\n"
    _atomic(out / SUMMARY, text.encode())
    _atomic(out / CURVES, curves_csv(runs).encode())
    _atomic(out / PLOT, plot_png(campaign, runs, stats))
    return [out / SUMMARY, out / CURVES, out / PLOT]


def _atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; outputs are ordinary files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def curves_csv(runs: Sequence[Run]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    timed = any(isinstance(r, TimedRun) for r in runs)
    writer.writerow(["policy", "seed", "time_s" if timed else "arrived_demand_pct",
                     "allocated_gpu_pct"])
    for run in runs:
        xs, ys = curve_of(run)
        writer.writerows([run.policy, run.seed, x, y] for x, y in zip(xs, ys, strict=True))
    return buf.getvalue()


def curve_of(run: Run) -> tuple[tuple[float, ...], tuple[float, ...]]:
    if isinstance(run, ProtocolRun):
        return run.curve_arrived_pct, run.curve_allocated_pct
    return run.curve_time_s, run.curve_allocated_pct


def mean_curve(runs: Sequence[Run]) -> tuple[np.ndarray, np.ndarray]:
    """Mean allocation over runs on their common grid (protocol: arrived %, same steps)."""
    if isinstance(runs[0], TimedRun):
        xs, _ = curve_of(runs[0])
        ys = np.mean([np.interp(xs, *curve_of(r)) for r in runs], axis=0)
        return np.asarray(xs), ys
    n = min(len(curve_of(r)[0]) for r in runs)
    return (np.asarray(curve_of(runs[0])[0][:n]),
            np.mean([curve_of(r)[1][:n] for r in runs], axis=0))


def plot_png(campaign: Campaign, runs: Sequence[Run], stats: Sequence[PolicyStats]) -> bytes:
    fig = Figure(figsize=(8, 5.5), dpi=110)  # no pyplot: no global figure state, Agg canvas
    ax = fig.subplots()
    if campaign.mode is SimMode.PROTOCOL:
        _plot_protocol(ax, runs, stats)
    else:
        _plot_timed(ax, runs, stats)
    ax.set_title(f"{campaign.scenario.name}: {len(campaign.scenario.nodes)} nodes, "
                 f"{campaign.scenario.gpu_capacity_milli // 1000} GPUs, "
                 f"{len(campaign.seeds)} seed(s)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _by_policy(runs: Sequence[Run]) -> dict[str, list[Run]]:
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.policy, []).append(run)
    return groups


def _plot_protocol(ax: Axes, runs: Sequence[Run], stats: Sequence[PolicyStats]) -> None:
    top = max(max(curve_of(r)[0]) for r in runs)
    ax.plot([0, 100], [0, 100], color="grey", linestyle=":", linewidth=1, label="y = x")
    ax.axvline(100, color="black", linestyle="--", linewidth=1)
    headline = {s.policy: s for s in stats}
    for policy, group in _by_policy(runs).items():
        xs, ys = mean_curve(group)
        s = headline[policy]
        (line,) = ax.plot(xs, ys, linewidth=1.6,
                          label=f"{policy}: {s.mean_unallocated_gpu_pct:.2f} % unallocated")
        at = int(np.searchsorted(xs, 100.0 - 1e-9))
        if at < xs.size:
            ax.plot([xs[at]], [ys[at]], marker="o", color=line.get_color())
    ax.text(100.5, 3, "arrived = 100 %", fontsize=8)
    ax.set_xlim(0, top)
    ax.set_ylim(0, 105)
    ax.set_xlabel("Arrived GPU demand (% of GPU capacity)")
    ax.set_ylabel("GPU allocation (% of GPU capacity)")


def _plot_timed(ax: Axes, runs: Sequence[Run], stats: Sequence[PolicyStats]) -> None:
    peak = {s.policy: s for s in stats}
    for policy, group in _by_policy(runs).items():
        xs, ys = mean_curve(group)
        label = f"{policy}: peak {peak[policy].mean_peak_allocation_pct or 0:.1f} %"
        ax.step((xs - xs[0]) / 3600.0, ys, where="post", linewidth=1.4, label=label)
    ax.set_xlabel("Time (hours since the first arrival)")
    ax.set_ylabel("GPU allocation (% of GPU capacity)")
