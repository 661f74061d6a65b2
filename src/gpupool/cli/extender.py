"""``gpupool extender``: serve the kube-scheduler extender (filter / prioritize / bind).

Here: the flags, and what is checked before anything starts (the policy and its
weights, the kubeconfig); ``extender_run`` then wires the pieces: a ``KubeApi``
(kubeconfig file, or the in-cluster service account when ``--kubeconfig`` is absent);
the decision signing keys (made on first start, published for node agents); the TLS
material (gpupool's own CA, the extender's serving certificate and kube-scheduler's
client certificate, each made or renewed in Secrets of ``--namespace``; or a Secret you
supply: ``--tls secret``); a ``ClusterCache`` fed by list + watch that counts only
decisions it can vouch for; the ``Extender`` with the chosen policy. The verbs are
served over mutual TLS on ``--port`` to clients whose certificate names
``--client-name``; ``/healthz``, ``/readyz`` and ``/metrics`` on the plain
``--probe-port``. A background thread re-checks GPU heartbeats and reconciles the GPU
ledgers every ``--sweep-every`` seconds, renews and reloads certificates and re-reads
the signing keys every ``--tls-every`` seconds, and re-derives FGD's target workload
every ``--workload-every``. With --preemption (the default) a GPU pod that fits
nowhere gets room by evicting GPU pods of lower priority (docs/design/preemption.md).
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from gpupool.cli.args import KUBECONFIG_HELP, add_log_level, bounded, check_weights, weight
from gpupool.cli.defaults import (
    CLIENT_SCHEDULER,
    CLIENT_SECRET,
    DEFAULT_POLICY,
    GANG_TIMEOUT_S,
    POLICY_NAMES,
    SCHEDULER_NAME,
    SERVICE,
    SERVING_SECRET,
    ZONE_LABEL,
)
from gpupool.extender.edge.sizing import MAX_NODES
from gpupool.extender.state.assumptions import ASSUME_EXPIRY_S

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
    p.add_argument("--scheduler-name", default=SCHEDULER_NAME, metavar="NAME",
                   help="bind acts only on pods naming this scheduler (default "
                        f"{SCHEDULER_NAME})")
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
    p.add_argument("--policy", default=DEFAULT_POLICY, choices=POLICY_NAMES,
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


def run(args: argparse.Namespace) -> int:
    """Check the policy and its weights and reach the cluster, then serve
    (``extender_run``: the modules that serving needs load only now)."""
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from gpupool.core.policies import make_policy  # numpy: once the flags are read
    from gpupool.core.policies.config import PolicyConfig
    from gpupool.extender.workload import BUILTIN_WORKLOAD

    check_weights(args.weight, [args.policy])
    make_policy(args.policy, PolicyConfig(BUILTIN_WORKLOAD, dict(args.weight)))  # fail fast
    from gpupool.kube.api import DraApi  # the Kubernetes client: once there is a cluster

    api = DraApi.connect(kubeconfig=args.kubeconfig, server=args.server)  # DRA claims too
    assert isinstance(api, DraApi)  # connect builds ``cls``
    from gpupool.cli.extender_run import serve

    return serve(args, api)
