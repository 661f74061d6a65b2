"""Prometheus metrics of the controller (its own registry), served with ``/healthz``.

Names (documented in docs/operations.md): quota per scope
``gpupool_controller_quota_{used,limit}_{gpus,memory_mib,core_pct}{scope, name}``; GPUs
per ``{model, pool}``: ``gpupool_controller_gpus``, ``..._gpus_healthy``,
``..._gpus_allocated``, ``..._gpus_free``, ``..._gpus_fragmented`` (whole GPUs, shares
summed), ``..._gpus_stale``, ``..._gpus_isolated``; ``gpupool_controller_pending_pods{reason}``,
``gpupool_controller_uncounted_decisions{reason}``, ``gpupool_controller_problems{kind}``;
rounds: ``gpupool_controller_reconcile_seconds``, ``..._reconciles_total{result}``,
``..._write_failures_total``, ``..._last_reconcile_timestamp_seconds``; leadership:
``gpupool_controller_is_leader``, ``gpupool_controller_leader_info{holder}``,
``gpupool_controller_lease_transitions``; fair share per tenant of a cohort that shares
fairly: ``gpupool_controller_tenant_fair_share{tenant, cohort, resource, kind}`` (kind
``wanted``, ``share``, ``entitled``), ``..._fair_share_ratio{tenant, cohort, resource}``
(used over entitled) and ``..._fair_share_dominant_ratio{tenant, cohort}``; healing:
``gpupool_controller_healing_total{cause, outcome}`` (docs/controller.md, "Healing"); remote
slices: ``gpupool_controller_remote_slices{state}`` and
``gpupool_controller_remote_slices_lost_total`` (docs/remote.md); preemption for remote
slices: ``gpupool_controller_remote_preemption_total{outcome}`` (docs/controller.md).

The cluster figures are set by the leader only, after each round; a replica that does
not lead clears them (summing over replicas never counts twice).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Gauge, Histogram, make_wsgi_app
from prometheus_client import Counter as PromCounter

from gpupool.controller.figures import PENDING_REASONS, Figures
from gpupool.controller.observed import Observed, Verify
from gpupool.core.state import MILLI
from gpupool.security.signing import SignatureError

ROUND_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_DIMS = (("gpus", "gpus", "GPUs"), ("memory_mib", "memory_mib", "MiB of GPU memory"),
         ("core_pct", "core_pct", "percent of one GPU's compute"))
_POOL = ("model", "pool")


class ControllerMetrics:
    """Every metric of one controller process."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        scope = ("scope", "name")
        self.used = {d: Gauge(f"gpupool_controller_quota_used_{n}",
                              f"Quota used, in {unit}, per scope (group, tenant, class)", scope,
                              registry=r) for d, n, unit in _DIMS}
        self.limit = {d: Gauge(f"gpupool_controller_quota_limit_{n}",
                               f"Quota limit, in {unit}, where one is set", scope, registry=r)
                      for d, n, unit in _DIMS}
        self.gpus = Gauge("gpupool_controller_gpus", "GPUs published", _POOL, registry=r)
        self.healthy = Gauge("gpupool_controller_gpus_healthy", "GPUs published healthy",
                             _POOL, registry=r)
        self.allocated = Gauge("gpupool_controller_gpus_allocated",
                               "Allocated GPU share in whole GPUs", _POOL, registry=r)
        self.free = Gauge("gpupool_controller_gpus_free", "Free GPU share in whole GPUs",
                          _POOL, registry=r)
        self.fragmented = Gauge("gpupool_controller_gpus_fragmented",
                                "Free GPU share a typical task cannot use (FGD fragmentation), "
                                "in whole GPUs", _POOL, registry=r)
        self.stale = Gauge("gpupool_controller_gpus_stale",
                           "GPUs whose node agent has not reported within the stale time",
                           _POOL, registry=r)
        self.isolated = Gauge("gpupool_controller_gpus_isolated",
                              "GPUs isolated by their node agent (a container over its slice)",
                              _POOL, registry=r)
        self.pending = Gauge("gpupool_controller_pending_pods",
                             "GPU pods not running yet, by reason", ["reason"], registry=r)
        self.uncounted = Gauge("gpupool_controller_uncounted_decisions",
                               "Pods whose decision is not counted, by reason: unsigned, "
                               "unknown-key, invalid (forged, copied, edited), not-a-gpu-pod",
                               ["reason"], registry=r)
        self.problems = Gauge("gpupool_controller_problems",
                              "Objects the controller could not read, by kind", ["kind"],
                              registry=r)
        self.seconds = Histogram("gpupool_controller_reconcile_seconds",
                                 "Time of one reconcile round (observe, plan, write)",
                                 buckets=ROUND_BUCKETS, registry=r)
        self.rounds = PromCounter("gpupool_controller_reconciles_total",
                                  "Reconcile rounds, by result (ok, failed: a write failed)",
                                  ["result"], registry=r)
        self.write_failures = PromCounter("gpupool_controller_write_failures_total",
                                          "Writes that failed (retried next round)", registry=r)
        self.last_round = Gauge("gpupool_controller_last_reconcile_timestamp_seconds",
                                "When the last reconcile round ended (Unix time)", registry=r)
        self.is_leader = Gauge("gpupool_controller_is_leader",
                               "1 while this replica leads (reconciles), else 0", registry=r)
        self.leader_info = Gauge("gpupool_controller_leader_info",
                                 "1 for the replica this one saw holding the lease",
                                 ["holder"], registry=r)
        self.transitions = Gauge("gpupool_controller_lease_transitions",
                                 "Lease changes of holder, as the lease counts them", registry=r)
        self._world: list[tuple[Gauge, set[tuple[str, ...]]]] = [
            (g, set()) for g in (*self.used.values(), *self.limit.values(), self.gpus,
                                 self.healthy, self.allocated, self.free, self.fragmented,
                                 self.stale, self.isolated,
                                 self.pending, self.uncounted, self.problems)]
        self.fair_share = Gauge("gpupool_controller_tenant_fair_share",
                                "Fair share of a tenant in a cohort that shares fairly, by "
                                "kind: wanted (what it would borrow with its waiting pods), "
                                "share (its part of what the cohort lends), entitled "
                                "(limit + share)", ["tenant", "cohort", "resource", "kind"],
                                registry=r)
        self.fair_ratio = Gauge("gpupool_controller_tenant_fair_share_ratio",
                                "What a tenant holds over what its fair share entitles it to "
                                "(above 1: it borrows beyond its share)",
                                ["tenant", "cohort", "resource"], registry=r)
        self.fair_dominant = Gauge("gpupool_controller_tenant_fair_share_dominant_ratio",
                                   "The largest fair_share_ratio of a tenant",
                                   ["tenant", "cohort"], registry=r)
        self._fair: list[tuple[Gauge, set[tuple[str, ...]]]] = [
            (g, set()) for g in (self.fair_share, self.fair_ratio, self.fair_dominant)]
        self.healing = PromCounter("gpupool_controller_healing_total",
                                   "Pods of failed GPUs or silent nodes, by cause and what "
                                   "became of their eviction", ["cause", "outcome"],
                                   registry=r)
        self.remote_slices = Gauge("gpupool_controller_remote_slices",
                                   "Remote GPU slices by the state of their slice server "
                                   "(starting, serving, lost, failed, unserved)", ["state"],
                                   registry=r)
        self.slices_lost = PromCounter("gpupool_controller_remote_slices_lost_total",
                                       "Slice servers found lost (serving, then silent past "
                                       "the deadline)", registry=r)
        self.remote_preemption = PromCounter(
            "gpupool_controller_remote_preemption_total",
            "Preemption for remote slices: per victim evicted, blocked (a disruption budget), "
            "failed, gone or deferred (over the per-minute cap); per pod left waiting, "
            "no-victims, invalid or unheld (its room could not be held: nobody evicted)",
            ["outcome"], registry=r)
        for outcome in ("evicted", "blocked", "failed", "gone", "deferred", "no-victims",
                        "invalid", "unheld"):
            self.remote_preemption.labels(outcome)
        self._lock = threading.Lock()
        for result in ("ok", "failed"):
            self.rounds.labels(result)

    def healed(self, cause: str, outcome: str) -> None:
        """One pod healing acted on (``evictions.Evictor``'s tally)."""
        self.healing.labels(cause, outcome).inc()

    def remote_preempted(self, outcome: str) -> None:
        """One outcome of preemption for remote slices (``remotepreemptor``'s tally)."""
        self.remote_preemption.labels(outcome).inc()

    def slices_kept(self, done: Any) -> None:
        """A round of ``slicekeeper.SliceKeeper`` (its ``SlicePlan``)."""
        for state in ("starting", "serving", "lost", "failed", "unserved"):
            self.remote_slices.labels(state).set(done.states.get(state, 0))
        self.slices_lost.inc(done.lost)

    # -- rounds --------------------------------------------------------------------------------
    def round_done(self, figs: Figures, observed: Observed, seconds: float, failures: int,
                   now_s: float | None = None) -> None:
        """Record one round and set every cluster figure from it."""
        self.round_ended(seconds, failures, now_s)
        self.set_world(figs, observed)

    def round_ended(self, seconds: float, failures: int, now_s: float | None = None) -> None:
        """Record one round: its time, its result, its failed writes."""
        self.seconds.observe(seconds)
        self.rounds.labels("failed" if failures else "ok").inc()
        self.write_failures.inc(failures)
        self.last_round.set(time.time() if now_s is None else now_s)

    def set_world(self, figs: Figures, observed: Observed) -> None:
        """Set every cluster figure (series no longer in ``figs`` are removed)."""
        series: dict[Gauge, dict[tuple[str, ...], float]] = {g: {} for g, _ in self._world}
        for q in figs.quotas:
            for dim, _, _ in _DIMS:
                series[self.used[dim]][q.scope, q.name] = getattr(q.used, dim)
                cap = getattr(q.limit, dim) if q.limit is not None else None
                if cap is not None:
                    series[self.limit[dim]][q.scope, q.name] = cap
        for p in figs.pools:
            key = (p.model, p.pool)
            series[self.gpus][key], series[self.healthy][key] = p.gpus, p.healthy
            series[self.allocated][key] = p.allocated_milli / MILLI
            series[self.free][key] = p.free_milli / MILLI
            series[self.fragmented][key] = p.fragmented_milli / MILLI
            series[self.stale][key], series[self.isolated][key] = p.stale, p.isolated
        for reason in PENDING_REASONS:
            series[self.pending][(reason,)] = figs.pending.get(reason, 0)
        for reason, n in figs.uncounted.items():
            series[self.uncounted][(reason,)] = n
        for kind, n in Counter(p.kind for p in observed.problems).items():
            series[self.problems][(kind,)] = n
        self._replace(series)

    def _replace(self, series: Mapping[Gauge, Mapping[tuple[str, ...], float]]) -> None:
        with self._lock:
            for i, (gauge, had) in enumerate(self._world):
                now = series.get(gauge, {})
                for gone in had - set(now):
                    gauge.remove(*gone)
                for labels, value in now.items():
                    gauge.labels(*labels).set(value)
                self._world[i] = (gauge, set(now))

    def clear_world(self) -> None:
        """Drop every cluster figure (this replica does not lead)."""
        self._replace({})
        self.set_fair_shares(())

    def set_fair_shares(self, figures: Iterable[Any]) -> None:
        """Set the fair-share series from ``fairstatus.FairShareFigure``s (series of
        tenants no longer listed are removed)."""
        series: dict[Gauge, dict[tuple[str, ...], float]] = {g: {} for g, _ in self._fair}
        for f in figures:
            e = f.entitlement
            for dim, name, _ in _DIMS:
                if getattr(e.entitled, dim) is None:
                    continue
                for kind, value in (("wanted", e.wanted), ("share", e.share),
                                    ("entitled", e.entitled)):
                    series[self.fair_share][f.tenant, f.cohort, name, kind] = \
                        getattr(value, dim)
                series[self.fair_ratio][f.tenant, f.cohort, name] = e.ratio(dim)
            if e.dominant is not None:
                series[self.fair_dominant][f.tenant, f.cohort] = e.dominant[1]
        with self._lock:
            for i, (gauge, had) in enumerate(self._fair):
                now = series[gauge]
                for gone in had - set(now):
                    gauge.remove(*gone)
                for labels, value in now.items():
                    gauge.labels(*labels).set(value)
                self._fair[i] = (gauge, set(now))

    # -- leadership ------------------------------------------------------------------------------
    def leadership(self, leading: bool, holder: str, transitions: int) -> None:
        self.is_leader.set(1 if leading else 0)
        self.leader_info.clear()
        if holder:
            self.leader_info.labels(holder).set(1)
        self.transitions.set(transitions)


class VerifyTally:
    """A ``Verify`` that counts the signature failures it raises, by reason, until ``take``."""

    def __init__(self, verify: Verify):
        self._verify = verify
        self._lock = threading.Lock()
        self._failed: Counter[str] = Counter()

    def __call__(self, uid: str, namespace: str, name: str, annotations: Mapping[str, str],
                 signature: str | None) -> str:
        try:
            return self._verify(uid, namespace, name, annotations, signature)
        except SignatureError as exc:
            reason = exc.code if exc.code in (SignatureError.UNSIGNED,
                                              SignatureError.UNKNOWN_KEY) else "invalid"
            with self._lock:
                self._failed[reason] += 1
            raise

    def take(self) -> dict[str, int]:
        """The failures since the last ``take``."""
        with self._lock:
            out, self._failed = dict(self._failed), Counter()
        return out


# -- serving ----------------------------------------------------------------------------------
class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes and probes are not logged."""


def probe_app(metrics: ControllerMetrics, healthy: Callable[[], bool]) -> Callable[..., Any]:
    """A WSGI app: ``/metrics`` (Prometheus text), ``/healthz`` (200, or 500 when
    ``healthy`` says the process is stuck), 404 for anything else."""
    prometheus = make_wsgi_app(metrics.registry)

    def app(environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            result: Iterable[bytes] = prometheus(environ, start)
            return result
        if path == "/healthz":
            ok = healthy()
            start("200 OK" if ok else "500 Internal Server Error",
                  [("Content-Type", "text/plain; charset=utf-8")])
            return [b"ok\n" if ok else b"leader election: renewals stuck\n"]
        start("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"not found: /metrics and /healthz are served\n"]

    return app


def serve(metrics: ControllerMetrics, address: str, port: int,
          healthy: Callable[[], bool] = lambda: True) -> WSGIServer:
    """Serve ``/metrics`` and ``/healthz`` on ``address:port`` in a thread; ``shutdown()``
    and ``server_close()`` stop it. ``port`` 0 picks a free port (``server_port``)."""
    server = make_server(address, port, probe_app(metrics, healthy), _Server, _Quiet)
    threading.Thread(target=server.serve_forever, name="controller-probes",
                     daemon=True).start()
    return server
