"""What a simulation leaves in its output folder.

* ``summary.json`` — the scenario, per run (``policy``, ``seed``,
  ``unallocated_gpu_pct``, failures by kind and reason, decision times, ...)
  and per policy (``mean_unallocated_gpu_pct``, ``std_unallocated_gpu_pct``, ...);
  ``seeds`` are the seeds that ran; ``partial`` is true when fewer runs finished
  than ``planned`` (policies, seeds, runs), ``interrupted`` when Ctrl-C stopped them;
* ``curves.csv`` — per policy and seed, allocation % against arrived demand %
  (protocol) or against time (timed);
* ``allocation.png`` — the mean curve of every policy with a band from its lowest to
  its highest seed; in protocol mode a second panel zooms in on arrived demand from
  80 % of the GPU capacity on, where the policies part.

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
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from gpupool.sim.campaign import Campaign, PolicyStats, Run, SimMode
from gpupool.sim.protocol import ProtocolRun
from gpupool.sim.timed import TimedRun

SUMMARY, CURVES, PLOT = "summary.json", "curves.csv", "allocation.png"


ZOOM_FROM_PCT = 80.0
"""The zoomed panel shows arrived demand from this share of the GPU capacity on."""


def seeds_run(campaign: Campaign, runs: Sequence[Run]) -> list[int]:
    """The campaign's seeds of which at least one run finished, in the campaign's order."""
    done = {r.seed for r in runs}
    return [seed for seed in campaign.seeds if seed in done]


def summary(campaign: Campaign, runs: Sequence[Run], stats: Sequence[PolicyStats],
            wall_s: float, interrupted: bool = False) -> dict[str, object]:
    s = campaign.scenario
    return {
        "mode": campaign.mode.value,
        "scenario": s.name,
        "nodes": len(s.nodes),
        "gpus": s.gpu_capacity_milli // 1000,
        "pods": len(s.pods),
        "trace_gpu_demand_pct": round(100.0 * s.gpu_demand_milli / s.gpu_capacity_milli, 4),
        "inflate": campaign.inflate if campaign.mode is SimMode.PROTOCOL else None,
        "seeds": seeds_run(campaign, runs),
        "partial": len(runs) < len(campaign.jobs),
        "interrupted": interrupted,
        "planned": {"policies": list(campaign.policies), "seeds": list(campaign.seeds),
                    "runs": len(campaign.jobs)},
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
              stats: Sequence[PolicyStats], wall_s: float,
              interrupted: bool = False) -> list[Path]:
    """Write the three outputs into ``out`` (created if needed); returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(summary(campaign, runs, stats, wall_s, interrupted), indent=2) + "\n"
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


def seed_curves(runs: Sequence[Run]) -> tuple[np.ndarray, np.ndarray]:
    """The runs' allocation curves on one grid: x, and y as [run, point]. Protocol: the
    same arrived-demand steps, cut to the shortest run; timed: the first run's instants."""
    if isinstance(runs[0], TimedRun):
        xs, _ = curve_of(runs[0])
        return np.asarray(xs), np.asarray([np.interp(xs, *curve_of(r)) for r in runs])
    n = min(len(curve_of(r)[0]) for r in runs)
    return (np.asarray(curve_of(runs[0])[0][:n]),
            np.asarray([curve_of(r)[1][:n] for r in runs]))


def mean_curve(runs: Sequence[Run]) -> tuple[np.ndarray, np.ndarray]:
    """Mean allocation over runs on their common grid (``seed_curves``)."""
    xs, ys = seed_curves(runs)
    return xs, ys.mean(axis=0)


def plot_png(campaign: Campaign, runs: Sequence[Run], stats: Sequence[PolicyStats]) -> bytes:
    protocol = campaign.mode is SimMode.PROTOCOL
    fig = Figure(figsize=(12, 5.5) if protocol else (8, 5.5), dpi=110)  # no pyplot: no
    if protocol:                                                          # global state
        whole, zoom = fig.subplots(1, 2, width_ratios=(1, 1))
        _plot_protocol(whole, runs, stats)
        _zoom(zoom, whole, runs)
    else:
        whole = fig.subplots()
        _plot_timed(whole, runs, stats)
    seeds = seeds_run(campaign, runs)
    partial = (f", PARTIAL: {len(runs)} of {len(campaign.jobs)} runs"
               if len(runs) < len(campaign.jobs) else "")
    fig.suptitle(f"{campaign.scenario.name}: {len(campaign.scenario.nodes)} nodes, "
                 f"{campaign.scenario.gpu_capacity_milli // 1000} GPUs, "
                 f"{len(seeds)} seed(s){partial}; bands: lowest to highest seed")
    whole.grid(True, alpha=0.3)
    whole.legend(loc="upper left", fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _by_policy(runs: Sequence[Run]) -> dict[str, list[Run]]:
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.policy, []).append(run)
    return groups


def _curve_with_band(ax: Axes, group: Sequence[Run], label: str, step: bool = False,
                     hours: bool = False) -> Line2D:
    """The mean curve of ``group`` and, shaded, its lowest to highest run."""
    xs, ys = seed_curves(group)
    if hours:
        xs = (xs - xs[0]) / 3600.0
    mean = ys.mean(axis=0)
    if step:
        (line,) = ax.step(xs, mean, where="post", linewidth=1.4, label=label)
    else:
        (line,) = ax.plot(xs, mean, linewidth=1.6, label=label)
    if len(group) > 1:
        ax.fill_between(xs, ys.min(axis=0), ys.max(axis=0), color=line.get_color(),
                        alpha=0.2, linewidth=0, step="post" if step else None)
    return line


def _plot_protocol(ax: Axes, runs: Sequence[Run], stats: Sequence[PolicyStats]) -> None:
    top = max(max(curve_of(r)[0]) for r in runs)
    ax.plot([0, 100], [0, 100], color="grey", linestyle=":", linewidth=1, label="y = x")
    ax.axvline(100, color="black", linestyle="--", linewidth=1)
    headline = {s.policy: s for s in stats}
    for policy, group in _by_policy(runs).items():
        s = headline[policy]
        line = _curve_with_band(ax, group, f"{policy}: {s.mean_unallocated_gpu_pct:.2f} % "
                                           f"unallocated")
        xs, ys = mean_curve(group)
        at = int(np.searchsorted(xs, 100.0 - 1e-9))
        if at < xs.size:
            ax.plot([xs[at]], [ys[at]], marker="o", color=line.get_color())
    ax.text(100.5, 3, "arrived = 100 %", fontsize=8)
    ax.set_xlim(0, top)
    ax.set_ylim(0, 105)
    ax.axvspan(ZOOM_FROM_PCT, top, color="grey", alpha=0.08, linewidth=0)
    ax.set_xlabel("Arrived GPU demand (% of GPU capacity)")
    ax.set_ylabel("GPU allocation (% of GPU capacity)")


def _zoom(ax: Axes, whole: Axes, runs: Sequence[Run]) -> None:
    """The curves of ``whole`` from ``ZOOM_FROM_PCT`` of arrived demand on, the allocation
    axis fitted to them (bands included)."""
    low, high = np.inf, -np.inf
    for group in _by_policy(runs).values():
        xs, ys = seed_curves(group)
        inside = xs >= ZOOM_FROM_PCT
        if inside.any():
            low, high = min(low, ys[:, inside].min()), max(high, ys[:, inside].max())
    for line in whole.get_lines():
        if line.get_transform() is not whole.transData:  # the line at 100 %, drawn below
            continue
        ax.plot(*line.get_data(), color=line.get_color(), linestyle=line.get_linestyle(),
                linewidth=line.get_linewidth(), marker=line.get_marker())
    ax.axvline(100, color="black", linestyle="--", linewidth=1)
    for band in whole.collections:
        ax.add_collection(_copy_band(band))
    margin = max((high - low) * 0.08, 0.5) if np.isfinite(low) else 1.0
    ax.set_xlim(ZOOM_FROM_PCT, whole.get_xlim()[1])
    ax.set_ylim(low - margin if np.isfinite(low) else 0, min(high + margin, 105)
                if np.isfinite(high) else 105)
    ax.set_title(f"zoom: arrived demand from {ZOOM_FROM_PCT:g} %", fontsize=10)
    ax.set_xlabel("Arrived GPU demand (% of GPU capacity)")
    ax.grid(True, alpha=0.3)


def _copy_band(band: object) -> PolyCollection:
    """A copy of a ``fill_between`` band for another axes (an artist has one axes)."""
    assert isinstance(band, PolyCollection)
    copy = PolyCollection([path.vertices for path in band.get_paths()],
                          facecolors=band.get_facecolor(), linewidths=0)
    return copy


def _plot_timed(ax: Axes, runs: Sequence[Run], stats: Sequence[PolicyStats]) -> None:
    peak = {s.policy: s for s in stats}
    for policy, group in _by_policy(runs).items():
        label = f"{policy}: peak {peak[policy].mean_peak_allocation_pct or 0:.1f} %"
        _curve_with_band(ax, group, label, step=True, hours=True)
    ax.set_xlabel("Time (hours since the first arrival)")
    ax.set_ylabel("GPU allocation (% of GPU capacity)")
