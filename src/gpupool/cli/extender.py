"""``gpupool extender``: serve the kube-scheduler extender (filter / prioritize / bind).

Wires the pieces: a ``KubeApi`` (kubeconfig file, or the in-cluster service
account when ``--kubeconfig`` is absent), a ``ClusterCache`` fed by list +
watch, the ``Extender`` with the chosen policy, and the starlette app under
uvicorn. A background thread re-checks GPU heartbeats every ``--sweep-every``
seconds and re-derives FGD's target workload every ``--workload-every``.
"""

from __future__ import annotations

import argparse
import logging
import threading
from typing import Any

import uvicorn

from gpupool.cli.args import bounded, weight
from gpupool.core.policies import DEFAULT_POLICY, POLICIES, make_policy
from gpupool.core.policies.config import PolicyConfig
from gpupool.extender.app import build_app
from gpupool.extender.cache import ClusterCache
from gpupool.extender.feeds import long_lived, start_feeds
from gpupool.extender.metrics import Metrics
from gpupool.extender.service import Extender, Settings
from gpupool.extender.workload import BUILTIN_WORKLOAD
from gpupool.kube.api import KubeApi

log = logging.getLogger("gpupool.extender")


SECONDS = bounded(float, 0, above=True)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("extender", help="serve the kube-scheduler extender",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account)")
    p.add_argument("--server", help=argparse.SUPPRESS)  # a bare API URL (tests, fakes)
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=8888, help="port to listen on (default 8888)")
    p.add_argument("--policy", default=DEFAULT_POLICY, choices=sorted(POLICIES),
                   help=f"placement policy (default {DEFAULT_POLICY})")
    p.add_argument("--weight", type=weight, action="append", default=[], metavar="NAME=X",
                   help="policy weight, repeatable (e.g. fgd-balance.lambda=0.5)")
    p.add_argument("--stale-after", type=SECONDS, default=120.0, metavar="SECONDS",
                   help="a GPU whose GPUDevice heartbeat is older is unhealthy (default 120)")
    p.add_argument("--ledger-grace", type=SECONDS, default=300.0, metavar="SECONDS",
                   help="ledger entries of pods never seen are dropped after this (default 300)")
    p.add_argument("--memory-unit", type=int, default=256, metavar="MIB",
                   help="GPU memory accounting unit in MiB (default 256)")
    p.add_argument("--sweep-every", type=SECONDS, default=15.0, metavar="SECONDS",
                   help="how often to re-check heartbeats (default 15)")
    p.add_argument("--workload-every", type=SECONDS, default=600.0, metavar="SECONDS",
                   help="how often to re-derive FGD's target workload (default 600)")
    p.add_argument("--seed", type=int, default=0, help="seed for tie breaking (default 0)")
    p.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    weights = dict(args.weight)
    make_policy(args.policy, PolicyConfig(BUILTIN_WORKLOAD, weights))  # fail fast on bad input
    api = KubeApi.connect(kubeconfig=args.kubeconfig, server=args.server)
    cache = ClusterCache(args.memory_unit, args.stale_after, args.ledger_grace)
    extender = Extender(cache, Settings(args.policy, weights, seed=args.seed), Metrics(), api)
    with long_lived():  # the rebuilt cache lives as long as the process
        feeds = start_feeds(api, cache)
        log.info("cluster view rebuilt: %d GPU nodes, %d allocations; workload: %s",
                 len(cache.state.nodes), len(cache.state.allocations),
                 extender.refresh_policy())
        extender.warm()
    stop = threading.Event()
    threading.Thread(target=_housekeeping, args=(extender, args, stop), daemon=True,
                     name="housekeeping").start()
    try:
        uvicorn.run(build_app(extender), host=args.host, port=args.port, log_level="warning",
                    access_log=False)
    finally:
        stop.set()
        feeds.stop()
        api.close()
    return 0


def _housekeeping(extender: Extender, args: argparse.Namespace, stop: threading.Event) -> None:
    since_workload = 0.0
    while not stop.wait(args.sweep_every):
        extender.cache.sweep()
        since_workload += args.sweep_every
        if since_workload >= args.workload_every:
            since_workload = 0.0
            log.info("target workload: %s", extender.refresh_policy())
