"""Where the extender's CPU went during a burst, by stage (``bench_burst.py --profile``).

The extender runs yappi on CPU time over every thread while the burst runs (``PROFILED``
below); it writes the function statistics (pstats) and each thread's CPU time. The
stages are named functions, each taken only under the caller given (pstats keeps the
time of a function per caller), so that no time is counted twice; what the named
stages leave is shown as the rest of its verb. A deterministic profiler slows a
program by a factor that differs per function (small Python calls pay most), so each
stage is shown as a share of the profiled CPU and as that share of the CPU per pod of
the same run taken without the profiler, not as measured milliseconds.
"""

from __future__ import annotations

import json
import pstats
from dataclasses import dataclass
from pathlib import Path

PROFILED = """
import json, os, signal, threading, yappi
def _start(*_):
    yappi.set_clock_type("cpu")
    yappi.start(builtins=True, profile_threads=True)
def _stop(*_):
    yappi.stop()
    path = os.environ["GPUPOOL_BENCH_PROFILE"]
    yappi.get_func_stats().save(path + ".part", type="pstat")
    with open(path + ".threads", "w") as out:
        names = {}
        for th in threading.enumerate():
            names[th.ident] = names[th.native_id] = th.name
        json.dump([[names.get(t.tid, t.name), t.ttot] for t in yappi.get_thread_stats()],
                  out)
    os.rename(path + ".part", path)
    yappi.clear_stats()
signal.signal(signal.SIGUSR1, _start)
signal.signal(signal.SIGUSR2, _stop)
"""
"""What ``--profile`` runs in the extender before ``main``: yappi (not a dependency of
gpupool: ``pip install yappi``), started and stopped by signals around the burst."""


@dataclass(frozen=True, slots=True)
class Stage:
    """``function`` (``file:Class.name``, the file's path tail) as called by ``caller``
    (the same form; None: from anywhere)."""

    verb: str
    label: str
    function: str
    caller: str | None = None


SERVICE = "extender/service.py"
STAGES = (
    Stage("filter", "request parsing (JSON)", "wire/protocol.py:read_args",
          f"{SERVICE}:Extender.filter_json"),
    Stage("filter", "pod -> request", f"{SERVICE}:Extender._request",
          f"{SERVICE}:Extender._filter"),
    Stage("filter", "state sync (flush)", "state/cache.py:ClusterCache.flush",
          f"{SERVICE}:Extender._filter"),
    Stage("filter", "sent names -> rows", f"{SERVICE}:_sent", f"{SERVICE}:Extender._filter"),
    Stage("filter", "fit + reasons + answer", f"{SERVICE}:Extender._filtered",
          f"{SERVICE}:Extender._filter"),
    Stage("filter", "assume", f"{SERVICE}:Extender._assume", f"{SERVICE}:Extender._filter"),
    Stage("prioritize", "request parsing (JSON)", "wire/protocol.py:read_args",
          f"{SERVICE}:Extender.prioritize_json"),
    Stage("prioritize", "pod -> request", f"{SERVICE}:Extender._request",
          f"{SERVICE}:Extender._prioritize"),
    Stage("prioritize", "state sync (flush)", "state/cache.py:ClusterCache.flush",
          f"{SERVICE}:Extender._prioritize"),
    Stage("prioritize", "sent names -> rows", f"{SERVICE}:_sent",
          f"{SERVICE}:Extender._prioritize"),
    Stage("prioritize", "fit (filter's kept, or again)", f"{SERVICE}:Extender._cycle_for",
          f"{SERVICE}:Extender._prioritize"),
    Stage("prioritize", "scoring", "core/placement.py:Placer.score",
          f"{SERVICE}:Extender._prioritize"),
    Stage("prioritize", "the pick's allocation", "core/placement.py:Placer.allocate_on",
          f"{SERVICE}:Extender._prioritize"),
    Stage("prioritize", "assume", f"{SERVICE}:Extender._assume",
          f"{SERVICE}:Extender._prioritize"),
    Stage("prioritize", "response encoding", "wire/nodenames.py:NameTable.priorities_json",
          f"{SERVICE}:Extender._prioritize"),
    Stage("bind", "request parsing (JSON)", "wire/protocol.py:decode",
          "edge/app.py:verb_handlers.<locals>.decoded.<locals>.<lambda>"),
    Stage("bind", "request parsing (fields)", "wire/protocol.py:parse_binding",
          f"{SERVICE}:Extender.bind"),
    Stage("bind", "gate (the pod as the API has it)", f"{SERVICE}:Extender._bind_request",
          f"{SERVICE}:Extender.bind"),
    Stage("bind", "decide on the node", "bind/binder.py:Binder._decide_on",
          "bind/binder.py:Binder._commit"),
    Stage("bind", "ledger compare-and-swap", "bind/ledgerbatch.py:LedgerBatches.commit",
          "bind/binder.py:Binder._commit"),
    Stage("bind", "quota admission", "tenancy/quotaledger.py:QuotaGate.admit",
          "bind/binder.py:Binder.bind"),
    Stage("bind", "signing", "bind/binder.py:Binder._signed", "bind/binder.py:Binder.bind"),
    Stage("bind", "Binding (API call)", "kube/api.py:.bind_pod", "bind/binder.py:Binder.bind"),
    Stage("bind", "cleanup", "bind/binder.py:Binder._remove_superseded",
          "bind/binder.py:Binder.bind"),
)
VERBS = {"filter": f"{SERVICE}:Extender.filter_json",
         "prioritize": f"{SERVICE}:Extender.prioritize_json",
         "bind": f"{SERVICE}:Extender.bind"}

Key = tuple[str, int, str]


def _matches(key: Key, spec: str) -> bool:
    path, name = spec.split(":", 1)
    return key[0].endswith(path) and (key[2] == name or
                                      (name.startswith(".") and key[2].endswith(name)))


def _cum(stats: dict[Key, tuple], spec: str, caller: str | None) -> float:
    total = 0.0
    for key, (_cc, _nc, _tt, ct, callers) in stats.items():
        if not _matches(key, spec):
            continue
        if caller is None:
            total += ct
            continue
        total += sum(v[3] for c, v in callers.items() if _matches(c, caller))
    return total


def split(path: Path) -> tuple[float, list[tuple[str, str, float]]]:
    """(profiled CPU seconds, [(verb, stage, seconds)]): the named stages, each verb's rest,
    the informers' threads (watch events) and the rest of the process (the HTTP server,
    metrics, housekeeping)."""
    stats: dict[Key, tuple] = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    threads = json.loads(Path(str(path) + ".threads").read_text())
    total = sum(t for _, t in threads)
    rows = [(s.verb, s.label, _cum(stats, s.function, s.caller)) for s in STAGES]
    for verb, spec in VERBS.items():
        named = sum(t for v, _, t in rows if v == verb)
        rows.append((verb, "the rest of the verb", _cum(stats, spec, None) - named))
    informers = sum(t for name, t in threads if name.startswith("informer-"))
    rows.append(("watch", "informers (pod and GPULedger events)", informers))
    rows.append(("server", "HTTP server, metrics, the rest",
                 total - sum(t for _, _, t in rows)))
    return total, rows


def report(path: Path, cpu_ms_per_pod: float) -> None:
    """Print the split of one profiled run, scaled to ``cpu_ms_per_pod``."""
    total, rows = split(path)
    print(f"where the CPU went ({path.name}; yappi's {total:.2f} s taken as "
          f"{cpu_ms_per_pod:.2f} ms a pod, the same run's own figure):")
    for verb, label, seconds in rows:
        share = seconds / total if total else 0.0
        print(f"  {verb:10} {label:38} {share * 100:5.1f} %  {share * cpu_ms_per_pod:5.2f} ms")
