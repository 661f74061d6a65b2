"""What ``gpupool controller`` does once connected: one reconcile (``--once``), or the
watch loop with leader election and the metrics server.

Kept apart from the command's flags (``gpupool.cli.controller``) so that a bad flag or a
kubeconfig that cannot be used is said before these modules load.
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

from rich.console import Console

from gpupool.cli.controller import slice_settings
from gpupool.controller.deviceclasses import DeviceClassSync
from gpupool.controller.evictions import Evictor
from gpupool.controller.figures import DeviceMemo, Heartbeats, figures
from gpupool.controller.healing import Healer, HealingConfig
from gpupool.controller.leader import ElectionTiming, LeaderElector, lead
from gpupool.controller.loop import Controller, Outcome, RoundObserver, WorldCache
from gpupool.controller.metrics import ControllerMetrics, VerifyTally, serve
from gpupool.controller.migplanner import MigPlanner
from gpupool.controller.observed import Observed
from gpupool.controller.remotepreempt import PreemptionConfig, RemotePlanner
from gpupool.controller.remotepreemptor import RemotePreemptor
from gpupool.controller.slicekeeper import SliceKeeper
from gpupool.core.errors import InvalidInput
from gpupool.core.serving import ZONE_LABEL, ServingConfig
from gpupool.kube.api import DraApi, KubeApi
from gpupool.kube.controller_ops import ControllerApi
from gpupool.kube.keystore import KeyRingSource
from gpupool.kube.lease import LeaseLock

log = logging.getLogger("gpupool.controller")


def reconcile(args: argparse.Namespace, api: ControllerApi) -> int:
    """Reconcile through ``api`` once (``--once``) or until SIGTERM or SIGINT."""
    verify = None
    if not args.trust_unsigned_decisions:
        verify = KeyRingSource(api, args.namespace, time.time).verify
    else:
        log.warning("counting decisions without checking their signatures "
                    "(--trust-unsigned-decisions): any pod author can claim GPUs")
    dra_api = DraApi.connect(args.kubeconfig, args.server, args.request_timeout) \
        if args.device_classes else None
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
                                               args.stale_after, args.metrics_every),
                            evictor=_evictor(args, api, metrics),
                            mig=MigPlanner(api) if args.mig_on_demand else None,
                            slices=_slices(args, api, metrics),
                            preemptor=_remote_preemptor(args, api, metrics))
    try:
        return _watch(args, controller, metrics)
    finally:
        _close(api, dra_api)


def _slices(args: argparse.Namespace, api: ControllerApi, metrics: ControllerMetrics
            ) -> SliceKeeper | None:
    chosen = slice_settings(args)
    if chosen is None:
        log.info("remote GPU slices off (--remote-provider none)")
        return None
    settings, timing = chosen
    return SliceKeeper(api, settings, timing, host=identity(), report=metrics.slices_kept)


def _remote_preemptor(args: argparse.Namespace, api: ControllerApi,
                      metrics: ControllerMetrics) -> RemotePreemptor | None:
    """Preemption for remote slices: only where remote slices are served."""
    if args.remote_provider == "none" or not args.remote_preemption:
        if args.remote_provider != "none":
            log.info("remote preemption off (--no-remote-preemption): pending remote-required "
                     "pods wait for room")
        return None
    try:
        domains = ServingConfig(True, tuple(args.topology_label or (ZONE_LABEL,))).domains
    except InvalidInput as exc:
        raise SystemExit(f"gpupool controller: --topology-label: {exc}") from None
    config = PreemptionConfig(True, args.remote_preemption_grace,
                              args.remote_preemption_per_minute, domains=domains,
                              hold_s=args.remote_preemption_hold)
    return RemotePreemptor(api, RemotePlanner(config), metrics.remote_preempted,
                           host=identity())


def _evictor(args: argparse.Namespace, api: ControllerApi, metrics: ControllerMetrics
             ) -> Evictor | None:
    if not args.healing:
        log.info("healing off (--no-healing): pods of failed GPUs and silent nodes stay")
        return None
    config = HealingConfig(True, args.heal_unhealthy_after, args.heal_silent_after,
                           args.heal_per_minute)
    return Evictor(api, Healer(config), metrics.healed, host=identity())


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
