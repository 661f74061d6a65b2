"""``gpupool extender``: serve the kube-scheduler extender (filter / prioritize / bind).

Wires the pieces: a ``KubeApi`` (kubeconfig file, or the in-cluster service account
when ``--kubeconfig`` is absent); the decision signing keys (made on first start,
published for node agents); the TLS material (gpupool's own CA, the extender's serving
certificate and kube-scheduler's client certificate, each made or renewed in Secrets of
``--namespace``; or a Secret you supply: ``--tls secret``); a ``ClusterCache`` fed by
list + watch that counts only decisions it can vouch for; the ``Extender`` with the
chosen policy. The verbs are served over mutual TLS on ``--port`` to clients whose
certificate names ``--client-name``; ``/healthz``, ``/readyz`` and ``/metrics`` on the
plain ``--probe-port``. A background thread re-checks GPU heartbeats and reconciles the
GPU ledgers every ``--sweep-every`` seconds, renews and reloads certificates and
re-reads the signing keys every ``--tls-every`` seconds, and re-derives FGD's target
workload every ``--workload-every``. With --preemption (the default) a GPU pod that fits
nowhere gets room by evicting GPU pods of lower priority (docs/design/preemption.md).
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
from typing import Any

import uvicorn

from gpupool.cli.args import KUBECONFIG_HELP, add_log_level, bounded, check_weights, weight
from gpupool.core.policies import DEFAULT_POLICY, POLICIES, make_policy
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.serving import ZONE_LABEL, ServingConfig
from gpupool.extender.bind.gangholds import GANG_TIMEOUT_S, GangSettings
from gpupool.extender.bind.gate import DEFAULT_SCHEDULER
from gpupool.extender.bind.reconcile import LedgerReconciler
from gpupool.extender.edge.app import build_app, build_probes, build_verbs
from gpupool.extender.edge.connections import ConnectionRules
from gpupool.extender.edge.server import probe_server, uvicorn_config
from gpupool.extender.edge.sizing import MAX_NODES, BodyLimits
from gpupool.extender.edge.tls import (
    CLIENT_SECRET,
    SERVICE,
    SERVING_SECRET,
    ReloadingContext,
    ServingMaterial,
    TlsSource,
)
from gpupool.extender.metrics import Metrics
from gpupool.extender.preemption.plans import PreemptionSettings
from gpupool.extender.service import Extender, Settings
from gpupool.extender.state.assumptions import ASSUME_EXPIRY_S
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.state.feeds import long_lived, start_feeds
from gpupool.extender.state.signatures import DecisionCheck, DecisionKeys
from gpupool.extender.workload import BUILTIN_WORKLOAD
from gpupool.kube.api import DraApi, KubeApi
from gpupool.kube.keystore import ensure_signing_keys, read_signing_keys
from gpupool.security.certs import CLIENT_SCHEDULER
from gpupool.security.signing import SigningKeys

log = logging.getLogger("gpupool.extender")

SECONDS = bounded(float, 0, above=True)
PORT = bounded(int, 1, 65535)
DESCRIPTION = """gpupool extender: serve the kube-scheduler extender (filter / prioritize / bind).

Reads the cluster (kubeconfig found as kubectl finds it, or the pod's service account),
makes the decision signing keys on first start and publishes them for the node agents,
and makes or renews its TLS material in Secrets of --namespace (gpupool's own CA, the
serving certificate and kube-scheduler's client certificate; or a Secret you supply:
--tls secret). It counts only the decisions it can vouch for, decides with the chosen
--policy, and serves the verbs over mutual TLS on --port to clients whose certificate
names --client-name; /healthz, /readyz and /metrics on the plain --probe-port. Every
--sweep-every seconds it re-checks GPU heartbeats and reconciles the GPU ledgers; every
--tls-every seconds it renews certificates and re-reads the signing keys; every
--workload-every seconds it re-derives FGD's target workload. With --preemption (the
default) a GPU pod that fits nowhere gets room by evicting GPU pods of lower priority
(docs/design/preemption.md). The members of a gang (a PodGroup, with --pod-groups, or a
gpupool.io/gang label) are placed together and their slices held for --gang-timeout
seconds, or none of them is (docs/gangs.md)."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("extender", help="serve the kube-scheduler extender",
                              description=DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kubeconfig", metavar="FILE", help=KUBECONFIG_HELP)
    p.add_argument("--server", help=argparse.SUPPRESS)  # a bare API URL (tests, fakes)
    p.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE") or "gpupool-system",
                   metavar="NAMESPACE",
                   help="gpupool's namespace: its keys and certificates are Secrets there "
                        "(default: $POD_NAMESPACE, else gpupool-system)")
    p.add_argument("--host", default="0.0.0.0", metavar="ADDRESS",
                   help="address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=PORT, default=8443, metavar="PORT",
                   help="port of the verbs, mutual TLS (default 8443)")
    p.add_argument("--probe-port", type=PORT, default=8080, metavar="PORT",
                   help="port of /healthz, /readyz and /metrics, plain HTTP (default 8080)")
    _tls_arguments(p)
    p.add_argument("--scheduler-name", default=DEFAULT_SCHEDULER, metavar="NAME",
                   help="bind acts only on pods naming this scheduler (default "
                        f"{DEFAULT_SCHEDULER})")
    p.add_argument("--max-nodes", type=bounded(int, 1), default=MAX_NODES, metavar="N",
                   help="the largest cluster served: sizes the request bodies accepted "
                        f"(default {MAX_NODES})")
    p.add_argument("--node-cache-capable", action=argparse.BooleanOptionalAction, default=True,
                   help="as the scheduler's nodeCacheCapable: names (default) or whole nodes "
                        "in each call; sizes the request bodies accepted")
    p.add_argument("--idle-timeout", type=SECONDS, default=30.0, metavar="SECONDS",
                   help="close a connection to the verbs idle this long (default 30; "
                        "probe connections: 2)")
    p.add_argument("--request-timeout", type=SECONDS, default=10.0, metavar="SECONDS",
                   help="close a connection to the verbs whose request has not fully "
                        "arrived this long after it began (default 10; probes: 2)")
    p.add_argument("--policy", default=DEFAULT_POLICY, choices=sorted(POLICIES),
                   help=f"placement policy (default {DEFAULT_POLICY})")
    p.add_argument("--weight", type=weight, action="append", default=[], metavar="NAME=X",
                   help="policy weight, repeatable (e.g. fgd-balance.lambda=0.5)")
    p.add_argument("--stale-after", type=SECONDS, default=120.0, metavar="SECONDS",
                   help="a GPU whose GPUDevice heartbeat is older is unhealthy (default 120)")
    p.add_argument("--ledger-grace", type=SECONDS, default=300.0, metavar="SECONDS",
                   help="a ledger entry of a pod never seen (nor found by the API server) "
                        "holds nothing after this (default 300)")
    p.add_argument("--memory-unit", type=int, default=256, metavar="MIB",
                   help="GPU memory accounting unit in MiB (default 256)")
    p.add_argument("--sweep-every", type=SECONDS, default=15.0, metavar="SECONDS",
                   help="how often to re-check heartbeats and reconcile ledgers (default 15)")
    p.add_argument("--tls-every", type=SECONDS, default=60.0, metavar="SECONDS",
                   help="how often to renew and reload certificates and re-read the signing "
                        "keys (default 60)")
    p.add_argument("--workload-every", type=SECONDS, default=600.0, metavar="SECONDS",
                   help="how often to re-derive FGD's target workload (default 600)")
    p.add_argument("--preemption", action=argparse.BooleanOptionalAction, default=True,
                   help="make room for a pod that fits nowhere by evicting GPU pods of lower "
                        "priority (their PodDisruptionBudgets honoured; default on)")
    p.add_argument("--preemption-hold", type=SECONDS, default=120.0, metavar="SECONDS",
                   help="how long the GPU room a preemption frees stays reserved for its pod "
                        "(default 120; longer than the victims' termination grace period)")
    p.add_argument("--preemption-retry", type=SECONDS, default=10.0, metavar="SECONDS",
                   help="how long a pod waits before preempting again after finding no "
                        "victims or failing (default 10)")
    p.add_argument("--assume-expiry", type=bounded(float, 0), default=ASSUME_EXPIRY_S,
                   metavar="SECONDS",
                   help="a placement handed to kube-scheduler's bind counts as taken for the "
                        "next pods until the bind comes, at most this long (default "
                        f"{ASSUME_EXPIRY_S:g}; 0: not at all)")
    p.add_argument("--pod-groups", action="store_true",
                   help="watch PodGroups (scheduling.k8s.io/v1alpha2: a cluster with the "
                        "GenericWorkload feature gate): their members are placed as gangs; "
                        "gpupool.io/gang labels make gangs either way (docs/gangs.md)")
    p.add_argument("--gang-timeout", type=SECONDS, default=GANG_TIMEOUT_S, metavar="SECONDS",
                   help="how long a gang's held GPU slices wait for its members' binds "
                        f"(default {GANG_TIMEOUT_S:g}, kube-scheduler's wait at Permit)")
    p.add_argument("--remote-slices", action="store_true",
                   help="place remote GPU slices: a remote-required pod runs on any node "
                        "(nodes without GPUs too) with its slice served by a slice server on "
                        "its own node, a node of its topology domains, or any node (needs a "
                        "data-plane provider: the controller's and webhook's "
                        "--remote-provider; docs/remote.md; default off: such pods are "
                        "refused)")
    p.add_argument("--topology-label", action="append", metavar="LABEL",
                   help="with --remote-slices: a node label whose value is a topology domain "
                        "remote slices are served from first; repeatable, most specific "
                        f"first (default {ZONE_LABEL})")
    p.add_argument("--seed", type=int, default=0, metavar="N",
                   help="seed for tie breaking (default 0)")
    add_log_level(p)
    p.set_defaults(func=run)


def _tls_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tls", choices=("gpupool", "secret"), default="gpupool",
                   help="gpupool: make and renew the CA, the serving certificate and "
                        "kube-scheduler's client certificate in Secrets (default); secret: "
                        "read --tls-secret as it is (cert-manager), write nothing")
    p.add_argument("--tls-secret", default=SERVING_SECRET, metavar="NAME",
                   help=f"the serving certificate's Secret (default {SERVING_SECRET})")
    p.add_argument("--client-secret", default=CLIENT_SECRET, metavar="NAME",
                   help="the Secret kube-scheduler mounts its client certificate from "
                        f"(default {CLIENT_SECRET})")
    p.add_argument("--service", default=SERVICE, metavar="NAME",
                   help=f"the Service the scheduler calls, named in the certificate "
                        f"(default {SERVICE})")
    p.add_argument("--client-name", action="append", default=None, metavar="NAME",
                   help="the client certificate's subject common name accepted, repeatable "
                        f"(default {CLIENT_SCHEDULER})")
    p.add_argument("--plain-http", action="store_true",
                   help="UNSAFE, for trying gpupool out: serve the verbs without TLS on "
                        "--port, to anyone who can reach it (they can bind any pod of "
                        "gpupool's scheduler)")


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


def _wire(args: argparse.Namespace) -> Wired:
    api = DraApi.connect(kubeconfig=args.kubeconfig, server=args.server)  # DRA claims too

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


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    check_weights(args.weight, [args.policy])
    make_policy(args.policy, PolicyConfig(BUILTIN_WORKLOAD, dict(args.weight)))  # fail fast
    wired = _wire(args)
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
