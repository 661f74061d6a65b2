"""What ``gpupool extender`` does once its flags are checked and the cluster is reached:
wire the signing keys, the cluster cache and the ``Extender``, make or read the TLS
material, rebuild the cluster view, and serve the verbs and the probes until stopped,
with the housekeeping thread beside them.

Kept apart from the command's flags (``gpupool.cli.extender``) so that a bad flag, an
unknown policy or weight, or a kubeconfig that cannot be used is said before these
modules (uvicorn, starlette, cryptography, the extender's own) load.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import uvicorn

from gpupool.core.serving import ZONE_LABEL, ServingConfig
from gpupool.extender.bind.gangclaims import GangSettings
from gpupool.extender.bind.reconcile import LedgerReconciler
from gpupool.extender.edge.app import build_app, build_probes, build_verbs
from gpupool.extender.edge.connections import ConnectionRules
from gpupool.extender.edge.server import probe_server, uvicorn_config
from gpupool.extender.edge.sizing import BodyLimits
from gpupool.extender.edge.tls import ReloadingContext, ServingMaterial, TlsSource
from gpupool.extender.metrics import Metrics
from gpupool.extender.preemption.plans import PreemptionSettings
from gpupool.extender.service import Extender, Settings
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.state.feeds import long_lived, start_feeds
from gpupool.extender.state.signatures import DecisionCheck, DecisionKeys
from gpupool.kube.api import DraApi, KubeApi
from gpupool.kube.keystore import ensure_signing_keys, read_signing_keys
from gpupool.security.certs import CLIENT_SCHEDULER
from gpupool.security.signing import SigningKeys

log = logging.getLogger("gpupool.extender")


@dataclass
class Wired:
    api: KubeApi
    extender: Extender
    keys: DecisionKeys
    reconciler: LedgerReconciler


@contextmanager
def briefly(api: KubeApi) -> Iterator[KubeApi]:
    """A connection of its own for an occasional call (Secrets and ConfigMaps, through
    lightkube's client): the client is let go after the call, so the ~15 MiB it holds is
    not held through the rebuild of the cache."""
    other = api.fork()
    try:
        yield other
    finally:
        other.close()


def _wire(args: argparse.Namespace, api: KubeApi) -> Wired:
    def load() -> SigningKeys:
        with briefly(api) as secrets:
            return read_signing_keys(secrets, args.namespace)[0]

    with briefly(api) as secrets:
        first = ensure_signing_keys(secrets, args.namespace, time.time())
    keys = DecisionKeys(load, time.time, keys=first)
    metrics = Metrics()
    cache = ClusterCache(args.memory_unit, args.stale_after, args.ledger_grace,
                         decisions=DecisionCheck(keys, metrics.unverified),
                         assume_expiry_s=args.assume_expiry)
    instance = os.environ.get("POD_NAME") or socket.gethostname()
    preemption = PreemptionSettings(args.preemption, args.preemption_hold,
                                    args.preemption_retry, instance=instance)
    serving = ServingConfig(args.remote_slices, tuple(args.topology_label or (ZONE_LABEL,)))
    settings = Settings(args.policy, dict(args.weight), seed=args.seed,
                        scheduler_name=args.scheduler_name, preemption=preemption,
                        serving=serving,
                        gangs=GangSettings(args.gang_timeout, args.namespace, instance))
    extender = Extender(cache, settings, metrics, api, keys)
    shared = extender.binder.quotas.ledgers if extender.binder is not None else None
    return Wired(api, extender, keys, LedgerReconciler(cache, api, quota_ledgers=shared))


def serve(args: argparse.Namespace, api: DraApi) -> int:
    """Rebuild the cluster view through ``api`` and serve until stopped (exit code 0)."""
    wired = _wire(args, api)
    tls = None if args.plain_http else ReloadingContext(_material(wired.api, args))
    extender = wired.extender
    with long_lived():  # the rebuilt cache lives as long as the process
        feeds = start_feeds(wired.api, extender.cache, pod_groups=args.pod_groups)
        log.info("cluster view rebuilt: %d GPU nodes, %d allocations; workload: %s",
                 len(extender.cache.state.nodes), len(extender.cache.state.allocations),
                 extender.refresh_policy())
        extender.warm()
    wired.reconciler.run_once()  # the ledgers put right at once, not after a grace
    stop = threading.Event()
    threading.Thread(target=_housekeeping, args=(wired, tls, args, stop), daemon=True,
                     name="housekeeping").start()
    try:
        _serve(extender, tls, args)
    finally:
        stop.set()
        extender.close()
        feeds.stop()
        wired.api.close()
    return 0


def _material(api: KubeApi, args: argparse.Namespace) -> ServingMaterial:
    source = TlsSource(args.namespace, args.tls, args.tls_secret, args.client_secret,
                       args.service)
    with briefly(api) as secrets:
        return source.material(secrets, time.time())


def _serve(extender: Extender, tls: ReloadingContext | None, args: argparse.Namespace) -> None:
    metrics = extender.metrics
    limits = BodyLimits.for_cluster(args.max_nodes, args.node_cache_capable)
    names = frozenset(args.client_name or [CLIENT_SCHEDULER])
    rules = ConnectionRules(args.idle_timeout, args.request_timeout,
                            client_names=None if tls is None else names)
    log.info("serving the verbs on %s:%d (%s), probes on :%d; bodies accepted: %s",
             args.host, args.port, "PLAIN HTTP, UNAUTHENTICATED" if tls is None else
             f"mutual TLS, clients {', '.join(sorted(names))}", args.probe_port,
             limits.describe())
    app = build_verbs(extender, limits) if tls is not None else build_app(extender, limits)
    server = uvicorn.Server(uvicorn_config(app, metrics.closed, rules,
                                           tls.listening if tls else None, host=args.host,
                                           port=args.port))
    probes = probe_server(build_probes(extender, lambda: bool(server.started)), args.host,
                          args.probe_port, metrics.closed)
    with probes:
        server.run()


def _housekeeping(wired: Wired, tls: ReloadingContext | None, args: argparse.Namespace,
                  stop: threading.Event) -> None:
    extender = wired.extender
    since_workload = since_tls = 0.0
    while not stop.wait(args.sweep_every):
        extender.cache.sweep()
        extender.sweep_gangs()
        if extender.replacer is not None:
            extender.replacer.sweep()
        wired.reconciler.run_once()
        since_workload += args.sweep_every
        since_tls += args.sweep_every
        if since_tls >= args.tls_every:
            since_tls = 0.0
            wired.keys.reload()
            _renew(wired.api, tls, args)
        if since_workload >= args.workload_every:
            since_workload = 0.0
            log.info("target workload: %s", extender.refresh_policy())


def _renew(api: KubeApi, tls: ReloadingContext | None, args: argparse.Namespace) -> None:
    if tls is None:
        return
    try:
        if tls.update(_material(api, args)):
            log.info("serving certificate reloaded from Secret %s/%s", args.namespace,
                     args.tls_secret)
    except Exception as exc:  # the API, or material that does not load: keep serving
        log.warning("renewing the serving certificate: %s", exc)
