"""Print a live ``gpupool inspect`` report: tables for people, JSON or YAML for programs.

The JSON and YAML forms are the report itself (``inspect_report``); the tables show
the same facts, one table per kind of thing, with the problems found listed last.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import yaml
from rich.console import Console, RenderableType
from rich.table import Table

from gpupool.cli.tables import screen, show

Report = dict[str, Any]


def emit(report: Report, output: str, console: Console | None = None) -> None:
    """Print ``report`` as ``output`` (table, json or yaml) on stdout; stop quietly when
    stdout is a pipe whose reader stopped reading (``| head``)."""
    try:
        _emit(report, output, console)
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that flushing at exit raises nothing


def _emit(report: Report, output: str, console: Console | None) -> None:
    if output == "json":
        print(json.dumps(report, indent=2, ensure_ascii=False))
        return
    if output == "yaml":
        print(yaml.safe_dump(report, sort_keys=False, allow_unicode=True), end="")
        return
    console = console or screen()
    for part in TABLES[report["kind"]](report):
        if isinstance(part, Table):
            show(console, part)  # the title above it, at the screen's width
        else:
            console.print(part)
    _footer(report, console)


def _footer(report: Report, console: Console) -> None:
    sig = report["signatures"]
    if not sig["checked"]:
        console.print(f"Decision signatures not checked: {sig['problem']}")
    problems = report["problems"]
    if problems:
        console.print(f"{len(problems)} problem(s):")
        for line in problems:
            console.print(f"  - {line}")


def _table(title: str, columns: Sequence[str], caption: str | None = None) -> Table:
    t = Table(title=title, caption=caption, title_justify="left", caption_justify="left")
    for name in columns:
        t.add_column(name, overflow="fold")
    return t


def _of(pair: Report, unit: str = "") -> str:
    return f"{pair['allocated']}/{pair['total']}{unit}"


# -- nodes ------------------------------------------------------------------------------------


def nodes_tables(report: Report) -> Iterator[RenderableType]:
    nodes = _table("GPU nodes", ("node", "GPUs", "CPU (m)", "memory (MiB)", "free GPU share",
                                 "fragmentation"),
                   f"fragmentation: free GPU share a typical task cannot use (workload: "
                   f"{report['fragmentationWorkload']})")
    gpus = _table("GPUs", ("node", "GPU", "model", "health", "isolation", "memory (MiB)",
                           "compute (%)", "pods holding slices"))
    for n in report["nodes"]:
        f = n["fragmentation"]
        nodes.add_row(n["name"], str(len(n["gpus"])), _of(n["cpuMilli"]), _of(n["memoryMiB"]),
                      f"{f['freeMilliGpu'] / 1000:g} GPU",
                      f"{f['milliGpu'] / 1000:g} GPU ({f['percentOfFree']:g} % of free)")
        for g in n["gpus"]:
            gpus.add_row(n["name"], f"#{g['index']}", g["model"], _health(g),
                         _isolation(g), _of(g["memoryMiB"]), _of(g["corePct"]), _holders(g))
    yield nodes
    yield gpus


def _health(g: Report) -> str:
    if g["stale"]:
        return f"{g['health']}, no heartbeat for {g['heartbeatAgeSeconds']} s (stale)"
    return str(g["health"])


def _isolation(g: Report) -> str:
    iso = g["isolation"]
    if iso is None:
        return "-"
    return f"{iso['state']}: {iso['reason']}" if iso["reason"] else str(iso["state"])


def _holders(g: Report) -> str:
    lines = []
    for h in g["holders"]:
        who = h["pod"] + (f" ({h['container']})" if h["container"] else "")
        line = f"{who} {h['memoryMiB']} MiB {h['corePct']} %"
        if h.get("remoteFrom"):
            line += f" (remote slice: the pod runs on {h['remoteFrom']})"
        if h["signature"] == "forged":
            line += " FORGED decision, not counted"
        elif not h["counted"]:
            line += f" not counted: {h['note']}"
        lines.append(line)
    return "\n".join(lines) or "-"


# -- one pod ----------------------------------------------------------------------------------


def pod_tables(report: Report) -> Iterator[RenderableType]:
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column(overflow="fold")
    for label, value in _pod_facts(report):
        facts.add_row(label, value)
    yield facts
    decision = report["decision"]
    if decision and decision.get("readable") and decision["gpus"]:
        t = _table("GPUs of the decision", ("container", "GPU", "uuid", "model",
                                           "memory (MiB)", "compute (%)"))
        for g in decision["gpus"]:
            t.add_row(g["container"] or "-", f"#{g['index']}", g["uuid"], g["model"] or "?",
                      str(g["memoryMiB"]), str(g["corePct"]))
        yield t
    fit = report["fit"]
    if fit is not None:
        yield _fit_table(fit)


def _pod_facts(report: Report) -> Iterator[tuple[str, str]]:
    yield "pod", report["pod"]
    phase = report["phase"] or "?"
    why = " — ".join(x for x in (report["reason"], report["message"]) if x)
    yield "phase", phase + (f" ({why})" if why else "")
    yield "node", report["node"] or "not bound"
    cond = report["scheduling"]
    if cond is not None and cond["status"] != "True":
        yield "scheduler", f"{cond['reason'] or 'not scheduled'}: {cond['message'] or ''}"
    req = report["request"]
    yield "request", req.get("error") or req["describe"] if req else "-"
    yield "group", report["group"] or "-"
    yield from _decision_facts(report)


def _served_line(d: Report) -> str:
    """Where a remote slice is served and what its server is doing."""
    line = f"a slice server on {d['servedBy']}"
    sl = d["slice"] or {}
    if sl.get("state"):
        line += f": {sl['state']}" + (f" ({sl['server']})" if sl.get("server") else "")
        line += f" since {sl['since']}" if sl.get("since") else ""
        line += f" — {sl['reason']}" if sl.get("reason") else ""
    else:
        line += ": no server reported yet"
    return line


def _decision_facts(report: Report) -> Iterator[tuple[str, str]]:
    d = report["decision"]
    if d is None:
        yield "decision", "none (gpupool has not placed this pod)"
        return
    if not d["readable"]:
        yield "decision", f"unreadable: {d['error']}"
    else:
        phase = d["phase"] + (f" ({d['phaseReason']})" if d["phaseReason"] else "")
        yield "decision", (f"node {d['node']}, {d['cpuMilli']}m CPU, {d['memoryMiB']} MiB, "
                           f"{len(d['gpus'])} GPU slice(s){', exclusive' if d['exclusive'] else ''}"
                           f"; phase {phase}; bound {d['bindTime'] or '?'}")
        yield "counted", "yes" if d["counted"] else f"no: {d['why']}"
        if d.get("servedBy"):
            yield "served by", _served_line(d)
    sig = report["signature"]
    if sig is not None:
        state = {"verified": "verified", "forged": "FORGED", "unchecked": "not checked",
                 "ledger": "vouched for by the GPU ledger"}[sig["state"]]
        yield "signature", f"{'present' if sig['present'] else 'absent'}, {state}: " \
                           f"{sig['message']}"


def _fit_table(fit: Report) -> RenderableType:
    blocked = fit["blocked"]
    if blocked:
        return f"Where it fits now: nowhere; refused before any node: {blocked}"
    caption = (f"{fit['fitting']} of {len(fit['nodes'])} nodes fit now; ★ = the node "
               f"{fit['policy']} would pick")
    t = _table("Where it fits now", ("node", "fits", "score", "GPUs it would take / why not"),
               caption)
    for n in fit["nodes"]:
        if n["fits"]:
            gpus = ", ".join(f"#{g['index']} {g['memoryMiB']} MiB {g['corePct']} %"
                             for g in n["gpus"]) or "no GPU"
            t.add_row(n["node"], "★ yes" if n["chosen"] else "yes", f"{n['score']:.4g}", gpus)
        else:
            t.add_row(n["node"], "no", "", n["reason"] or "does not fit")
    return t


# -- groups -----------------------------------------------------------------------------------


def _used(pair: Report) -> str:
    limit = pair["limit"]
    return f"{pair['used']}/{'-' if limit is None else limit}"


def groups_tables(report: Report) -> Iterator[RenderableType]:
    t = _table("Resource groups", ("group", "tenants", "GPUs", "memory (MiB)", "compute (%)",
                                   "within quota", "pods"),
               "used/limit; - = no limit")
    for g in report["groups"]:
        if not g["valid"]:
            t.add_row(g["name"], f"BROKEN: {g['problem']}", "", "", "", "", "")
            continue
        q = g["quota"]
        t.add_row(g["name"], ", ".join(g["tenants"]) or "everyone",
                  f"{_used(q['gpus'])} of {g['memberGpus']} members", _used(q["memoryMiB"]),
                  _used(q["corePct"]), "yes" if g["withinQuota"] else "NO", str(g["pods"]))
    yield t
    tenants = _table("Tenants (namespaces)", ("tenant", "GPUs", "memory (MiB)", "compute (%)",
                                              "GPUs per class"))
    for row in report["tenants"]:
        used = row["used"]
        classes = ", ".join(f"{c}: {n}" for c, n in row["classes"].items()) or "-"
        tenants.add_row(row["tenant"], str(used["gpus"]), str(used["memoryMiB"]),
                        str(used["corePct"]), classes)
    yield tenants


TABLES: dict[str, Callable[[Report], Iterator[RenderableType]]] = {
    "GPUNodes": nodes_tables, "GPUPod": pod_tables, "GPUGroups": groups_tables}
