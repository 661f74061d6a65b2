"""gpupool controller: keep gpupool's custom resources in line with the cluster.

Creates a default ResourceClass per GPU model, writes the status of every
ResourceClass and ResourceGroup (validity, selected GPUs, quota allocated /
limit / remaining per tenant, class and group). A pod's decision counts only if
it asks a gpupool GPU resource and its signature verifies with gpupool's published
decision keys (ConfigMap gpupool-decision-keys in --namespace); others are listed as
problems and hold nothing. Watches the API and reconciles
on every change and every --resync-seconds; --once reconciles once,
prints what it did and exits (0, or 1 if a write failed).

Replicas elect a leader through the Lease --lease-name in --lease-namespace (as
kube-controller-manager does): only the leader reconciles, the others wait to take over.
/metrics and /healthz are served on --metrics-port. See docs/controller.md and
docs/operations.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from typing import Any

from rich.console import Console

from gpupool.cli.args import KUBECONFIG_HELP, bounded
from gpupool.controller.deviceclasses import DeviceClassSync
from gpupool.controller.figures import POOL_LABEL, DeviceMemo, Heartbeats, figures
from gpupool.controller.leader import ElectionTiming, LeaderElector, lead
from gpupool.controller.loop import Controller, Outcome, RoundObserver, WorldCache
from gpupool.controller.metrics import ControllerMetrics, VerifyTally, serve
from gpupool.controller.observed import Observed
from gpupool.kube.api import DraApi, KubeApi
from gpupool.kube.controller_ops import ControllerApi
from gpupool.kube.keystore import KeyRingSource
from gpupool.kube.lease import LeaseLock

log = logging.getLogger("gpupool.controller")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("controller", help="reconcile gpupool's custom resources",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kubeconfig", metavar="FILE", help=KUBECONFIG_HELP)
    p.add_argument("--server", help=argparse.SUPPRESS)  # a bare API URL (tests, fakes)
    p.add_argument("--resync-seconds", type=bounded(float, 1, 86_400), default=300.0,
                   metavar="SECONDS",
                   help="reconcile at least this often even without events (default 300)")
    p.add_argument("--once", action="store_true", help="reconcile once, print, exit")
    p.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE") or "gpupool-system",
                   help="gpupool's namespace, where the decision keys are published (default: "
                        "$POD_NAMESPACE, else gpupool-system)")
    p.add_argument("--trust-unsigned-decisions", action="store_true",
                   help="count decisions without checking their signatures (only for clusters "
                        "without gpupool's extender, whose node agents decide unsigned; "
                        "unsafe against hostile tenants)")
    p.add_argument("--no-device-classes", dest="device_classes", action="store_false",
                   help="do not maintain DRA DeviceClasses (resource.k8s.io/v1) for gpupool's "
                        "classes and GPU models")
    p.add_argument("--dra-extended-resources", action="store_true",
                   help="give the DeviceClasses extendedResourceName (gpupool.io/gpu, "
                        "class.gpupool.io/<class>), so pods asking those resources are served "
                        "whole GPUs through DRA on DRA nodes (needs the DRAExtendedResource "
                        "feature)")
    _election_arguments(p)
    p.add_argument("--metrics-port", type=bounded(int, 0, 65535), default=8080, metavar="PORT",
                   help="port of /metrics and /healthz, plain HTTP (0: off; default 8080)")
    p.add_argument("--metrics-address", default="0.0.0.0", metavar="ADDRESS",
                   help="address /metrics and /healthz listen on (default 0.0.0.0)")
    p.add_argument("--pool-label", default=POOL_LABEL, metavar="LABEL",
                   help="the GPUDevice label (spec.labels) that names a GPU's pool in the "
                        f"metrics (default {POOL_LABEL})")
    p.add_argument("--metrics-every", type=bounded(float, 0, 3600), default=10.0,
                   metavar="SECONDS",
                   help="work out the cluster figures of the metrics (quota, GPUs, "
                        "fragmentation, pending pods) after a round at most this often "
                        "(default 10; 0: after every round)")
    p.add_argument("--stale-after", type=bounded(float, 1, 86_400), default=120.0,
                   metavar="SECONDS",
                   help="count a GPU as stale in the metrics when its node agent has not "
                        "reported for this long (default 120, as the extender)")
    p.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    p.set_defaults(func=run)


def _election_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=True,
                   help="elect a leader among replicas; only the leader reconciles "
                        "(default: on; --no-leader-elect for a single replica)")
    p.add_argument("--lease-name", default="gpupool-controller", metavar="NAME",
                   help="the coordination.k8s.io Lease of the election "
                        "(default gpupool-controller)")
    p.add_argument("--lease-namespace", default=None, metavar="NAMESPACE",
                   help="the Lease's namespace (default: --namespace)")
    p.add_argument("--lease-duration-seconds", type=bounded(int, 1, 3600), default=15,
                   metavar="SECONDS", help="how long followers wait for a silent leader "
                                           "before taking over (default 15)")
    p.add_argument("--renew-deadline-seconds", type=bounded(float, 0, 3600, above=True),
                   default=10.0, metavar="SECONDS",
                   help="the leader stops leading when it could not renew for this long "
                        "(default 10)")
    p.add_argument("--retry-period-seconds", type=bounded(float, 0, 600, above=True),
                   default=2.0, metavar="SECONDS",
                   help="how often candidates try the Lease (default 2)")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2"):  # one line per API request at INFO
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.root.level))
    api = ControllerApi.open(kubeconfig=args.kubeconfig, server=args.server)
    verify = None
    if not args.trust_unsigned_decisions:
        verify = KeyRingSource(api, args.namespace, time.time).verify
    else:
        log.warning("counting decisions without checking their signatures "
                    "(--trust-unsigned-decisions): any pod author can claim GPUs")
    dra_api = DraApi.connect(args.kubeconfig, args.server) if args.device_classes else None
    classes = DeviceClassSync(dra_api, args.dra_extended_resources) \
        if isinstance(dra_api, DraApi) else None
    if args.once:
        try:
            outcome = Controller(api, verify=verify, device_classes=classes).reconcile_once()
            _print(outcome)
            return 1 if outcome.failures else 0
        finally:
            _close(api, dra_api)
    metrics = ControllerMetrics()
    tally = VerifyTally(verify) if verify is not None else None
    controller = Controller(api, verify=tally, device_classes=classes,
                            observer=_observer(metrics, tally, args.pool_label,
                                               args.stale_after, args.metrics_every))
    try:
        return _watch(args, controller, metrics)
    finally:
        _close(api, dra_api)


def _close(*apis: KubeApi | None) -> None:
    for api in apis:
        if api is not None:
            api.close()


def _observer(metrics: ControllerMetrics, tally: VerifyTally | None, pool_label: str,
              stale_after_s: float, every_s: float) -> RoundObserver:
    """Records every round; works the cluster figures out at most every ``every_s`` (they
    cost about as much as the round itself on a large cluster)."""
    memo = DeviceMemo()
    last = [-float("inf")]

    def observe(observed: Observed, world: WorldCache, outcome: Outcome,
                seconds: float) -> None:
        unverified = tally.take() if tally is not None else {}  # this round's failures
        metrics.round_ended(seconds, len(outcome.failures))
        metrics.set_fair_shares(outcome.fair_shares)  # cheap: every round
        if time.monotonic() - last[0] < every_s:
            return
        last[0] = time.monotonic()
        beats = Heartbeats(memo.read(world.objects("gpudevices")), time.time(), stale_after_s)
        metrics.set_world(figures(observed, world.objects("pods"), unverified, pool_label,
                                  beats), observed)
    return observe


def _watch(args: argparse.Namespace, controller: Controller, metrics: ControllerMetrics
           ) -> int:
    """Reconcile until SIGTERM or SIGINT: while leading, or always without an election."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    elector = _elector(args, metrics) if args.leader_elect else None
    server = serve(metrics, args.metrics_address, args.metrics_port,
                   elector.healthy if elector is not None else lambda: True) \
        if args.metrics_port else None
    log.info("watching; resync every %.0f s; metrics %s", args.resync_seconds,
             f"on port {args.metrics_port}" if server is not None else "off")
    try:
        if elector is None:
            metrics.leadership(True, "", 0)
            controller.run(stop, args.resync_seconds)
        else:
            _elect_and_run(elector, stop, controller, metrics, args.resync_seconds)
        return 0
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()


def identity() -> str:
    """This replica's name in the Lease: the pod's name and a random suffix (a restarted
    pod is a new candidate)."""
    pod = os.environ.get("POD_NAME") or socket.gethostname() or "gpupool-controller"
    return f"{pod}_{uuid.uuid4().hex[:12]}"


def _elector(args: argparse.Namespace, metrics: ControllerMetrics) -> LeaderElector:
    try:
        timing = ElectionTiming(args.lease_duration_seconds, args.renew_deadline_seconds,
                                args.retry_period_seconds)
    except ValueError as exc:
        raise SystemExit(f"gpupool controller: {exc}") from None
    # calls of the election end within one retry period, so a leader cut off from the API
    # notices within the renew deadline plus one retry period
    lease_api = KubeApi.connect(args.kubeconfig, args.server, timeout_s=timing.retry_period_s)
    namespace = args.lease_namespace or args.namespace

    def changed(e: LeaderElector) -> None:
        leading = e.is_leader()
        metrics.leadership(leading, e.leader(), e.transitions())
        if not leading:
            metrics.clear_world()

    elector = LeaderElector(LeaseLock(lease_api, namespace, args.lease_name), identity(),
                            timing, on_change=changed)
    metrics.leadership(False, "", 0)
    return elector


def _elect_and_run(elector: LeaderElector, stop: threading.Event, controller: Controller,
                   metrics: ControllerMetrics, resync_s: float) -> None:
    elector_stop = threading.Event()
    thread = threading.Thread(target=elector.run, args=(elector_stop,), name="leader-election",
                              daemon=True)
    thread.start()

    def work(ended: threading.Event) -> None:
        controller.run(ended, resync_s)
        metrics.clear_world()

    try:
        lead(elector, stop, work)
    finally:
        elector_stop.set()  # after the leader's work stopped: the lease is given up
        thread.join(elector.timing.retry_period_s + 5)
        if isinstance(elector.lock, LeaseLock):
            elector.lock.api.close()


def _print(outcome: Outcome) -> None:
    console = Console()
    for title, items in (("created", outcome.created), ("updated", outcome.updated),
                         ("deleted", outcome.deleted), ("status written", outcome.statuses),
                         ("DRA", outcome.device_classes)):
        for item in items:
            console.print(f"{title}: {item}", markup=False, highlight=False)
    err = Console(stderr=True)
    for line in (*outcome.notes, *outcome.failures):
        err.print(f"note: {line}", markup=False, highlight=False, soft_wrap=True)
    console.print(outcome.summary(), markup=False, highlight=False)
    sys.stdout.flush()
