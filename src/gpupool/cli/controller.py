"""``gpupool controller``: keep gpupool's custom resources in line with the cluster.

Creates a default ResourceClass per GPU model, writes the status of every
ResourceClass and ResourceGroup (validity, selected GPUs, quota allocated /
limit / remaining per tenant, class and group). A pod's decision counts only if
it asks a gpupool GPU resource and its signature verifies with gpupool's published
decision keys (ConfigMap gpupool-decision-keys in --namespace); others are listed as
problems and hold nothing. Watches the API and reconciles
on every change and every ``--resync-seconds``; ``--once`` reconciles once,
prints what it did and exits (0, or 1 if a write failed). See docs/controller.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from rich.console import Console

from gpupool.cli.args import bounded
from gpupool.controller.deviceclasses import DeviceClassSync
from gpupool.controller.loop import Controller, Outcome
from gpupool.kube.api import DraApi
from gpupool.kube.controller_ops import ControllerApi
from gpupool.kube.keystore import KeyRingSource

log = logging.getLogger("gpupool.controller")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("controller", help="reconcile gpupool's custom resources",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account)")
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
    p.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    p.set_defaults(func=run)


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
    controller = Controller(api, verify=verify, device_classes=classes)
    try:
        if args.once:
            outcome = controller.reconcile_once()
            _print(outcome)
            return 1 if outcome.failures else 0
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        log.info("watching; resync every %.0f s", args.resync_seconds)
        controller.run(stop, args.resync_seconds)
        return 0
    finally:
        api.close()
        if dra_api is not None:
            dra_api.close()


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
