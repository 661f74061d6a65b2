"""gpupool controller: keep gpupool's custom resources in line with the cluster.

Creates a default ResourceClass per GPU model, writes the status of every
ResourceClass and ResourceGroup (validity, selected GPUs, quota allocated /
limit / remaining per tenant, class and group). A pod's decision counts only if
it asks a gpupool GPU resource and its signature verifies with gpupool's published
decision keys (ConfigMap gpupool-decision-keys in --namespace); others are listed as
problems and hold nothing. Watches the API and reconciles
on every change and every --resync-seconds; --once reconciles once,
prints what it did and exits (0, or 1 if a write failed).

With --remote-provider, keeps the slice servers of remote GPU slices: a server pod per
slice on its decided node and GPU, its Service, its and its sidecar's session
certificates (renewed, revoked at release), the state of each on its pod; lost servers'
slices are placed again by the extender, and everything of a gone pod is removed.

Replicas elect a leader through the Lease --lease-name in --lease-namespace (as
kube-controller-manager does): only the leader reconciles, the others wait to take over.
/metrics and /healthz are served on --metrics-port. See docs/controller.md and
docs/operations.md.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from gpupool.cli.args import KUBECONFIG_HELP, bounded
from gpupool.contract import names
from gpupool.contract.slices import PROVIDERS


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
    p.add_argument("--request-timeout", type=bounded(float, 0, 600, above=True), default=10.0,
                   metavar="SECONDS",
                   help="how long to wait for the API server to connect, and then for each "
                        "answer (default 10)")
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
    p.add_argument("--pool-label", default=names.LABEL_POOL, metavar="LABEL",
                   help="the GPUDevice label (spec.labels) that names a GPU's pool in the "
                        f"metrics (default {names.LABEL_POOL})")
    p.add_argument("--metrics-every", type=bounded(float, 0, 3600), default=10.0,
                   metavar="SECONDS",
                   help="work out the cluster figures of the metrics (quota, GPUs, "
                        "fragmentation, pending pods) after a round at most this often "
                        "(default 10; 0: after every round)")
    p.add_argument("--stale-after", type=bounded(float, 1, 86_400), default=120.0,
                   metavar="SECONDS",
                   help="count a GPU as stale in the metrics when its node agent has not "
                        "reported for this long (default 120, as the extender)")
    _healing_flags(p)
    _slice_flags(p)
    p.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    p.set_defaults(func=run)


def _healing_flags(p: Any) -> None:
    p.add_argument("--healing", action=argparse.BooleanOptionalAction, default=True,
                   help="evict the GPU pods of failed GPUs and silent nodes so that their "
                        "owners make new ones gpupool places elsewhere (default: on; a pod "
                        "annotated gpupool.io/healing: off is left; docs/controller.md)")
    p.add_argument("--heal-unhealthy-after", type=bounded(float, 0, 86_400), default=60.0,
                   metavar="SECONDS",
                   help="heal a GPU's pods once it has been unhealthy this long (default 60)")
    p.add_argument("--heal-silent-after", type=bounded(float, 1, 86_400), default=300.0,
                   metavar="SECONDS",
                   help="heal a node's GPU pods once its node agent has not reported for this "
                        "long (default 300)")
    p.add_argument("--heal-per-minute", type=bounded(int, 1, 10_000), default=10,
                   metavar="N", help="evictions healing starts per minute, cluster-wide "
                                     "(default 10)")
    p.add_argument("--mig-on-demand", action="store_true",
                   help="ask node agents to repartition idle or growable GPUs in MIG mode for "
                        "pending pods whose MIG profile no GPU offers (off by default; the "
                        "agents need --mig-on-demand too; docs/design/mig.md)")


def _slice_flags(p: argparse.ArgumentParser) -> None:
    r = p.add_argument_group("remote GPU slices (docs/remote.md)")
    r.add_argument("--remote-provider", choices=PROVIDERS, default="none",
                   help="the data plane of remote slices: stub (gpupool's stand-in), lupine, "
                        "or none: no slice server is started (default none)")
    r.add_argument("--slice-namespace", default="gpupool-slices", metavar="NAMESPACE",
                   help="the namespace of the slice servers, their Services and Secrets, the "
                        "session CA and the revocation list: the controller's alone "
                        "(default gpupool-slices)")
    r.add_argument("--slice-server-image", default="", metavar="IMAGE",
                   help="image of the slice servers (stub: gpupool's; lupine: LUPINE's server "
                        "image with gpupool added; default none: required with "
                        "--remote-provider)")
    r.add_argument("--lupine-server-command", default="", metavar="COMMAND",
                   help="with --remote-provider lupine: LUPINE's server in that image, "
                        "{port} for its loopback port (default none: required)")
    r.add_argument("--lupine-server-env", action="append", default=[], metavar="NAME=VALUE",
                   help="a variable for LUPINE's server, repeatable (default SCUDA_PORT={port})")
    r.add_argument("--slice-server-cpu", default="100m", metavar="QUANTITY",
                   help="CPU each slice server pod requests (default 100m)")
    r.add_argument("--slice-server-memory", default="128Mi", metavar="QUANTITY",
                   help="memory each slice server pod requests and is limited to "
                        "(default 128Mi)")
    r.add_argument("--slice-lost-after", type=bounded(float, 1, 3600), default=30.0,
                   metavar="SECONDS",
                   help="a serving slice server not answering for this long is lost and its "
                        "slice placed again (default 30)")
    r.add_argument("--slice-start-deadline", type=bounded(float, 1, 86_400), default=300.0,
                   metavar="SECONDS",
                   help="a slice server not ready this long after it was made has failed "
                        "(default 300)")
    r.add_argument("--slice-retry-after", type=bounded(float, 1, 86_400), default=120.0,
                   metavar="SECONDS",
                   help="a lost or failed slice not placed elsewhere by then is served again "
                        "where its decision says (default 120)")
    r.add_argument("--session-lifetime", type=bounded(float, 60, 86_400 * 30), default=3600.0,
                   metavar="SECONDS",
                   help="lifetime of the sidecars' and servers' session certificates, "
                        "renewed when a third is left (default 3600)")
    r.add_argument("--mps-root", default="/run/gpupool/mps", metavar="DIR",
                   help="the node agents' --mps-root, mounted into slice servers on MPS "
                        "nodes (default /run/gpupool/mps)")
    r.add_argument("--hami-core-library", default="/usr/local/vgpu/libvgpu.so",
                   metavar="FILE",
                   help="HAMi-core's library on the nodes, for slice servers on HAMi-core "
                        "nodes (default /usr/local/vgpu/libvgpu.so)")
    r.add_argument("--remote-preemption", action=argparse.BooleanOptionalAction, default=True,
                   help="with --remote-provider: evict GPU pods of strictly lower priority to "
                        "make room for a pending remote-required pod's slice (default: on, as "
                        "kube-scheduler preempts; a pod with preemptionPolicy: Never waits)")
    r.add_argument("--remote-preemption-grace", type=bounded(float, 0, 86_400), default=30.0,
                   metavar="SECONDS",
                   help="preempt for a remote-required pod once kube-scheduler has found no "
                        "node for it this long (default 30)")
    r.add_argument("--remote-preemption-per-minute", type=bounded(int, 1, 10_000), default=10,
                   metavar="N", help="evictions remote preemption starts per minute, "
                                     "cluster-wide (default 10)")
    r.add_argument("--remote-preemption-hold", type=bounded(float, 1, 86_400), default=120.0,
                   metavar="SECONDS",
                   help="how long the room remote preemption makes is held for its pod in the "
                        "serving node's GPU ledger, as the extender's --preemption-hold "
                        "(default 120)")
    r.add_argument("--topology-label", action="append", metavar="LABEL",
                   help="a node label whose value is a topology domain, as the extender's "
                        "--topology-label (repeatable, most specific first; default "
                        "topology.kubernetes.io/zone): remote preemption frees room in the "
                        "pod's own domain first")


def slice_settings(args: argparse.Namespace) -> tuple[Any, Any] | None:
    """The slice servers' settings and timing (``sliceserver.ServerSettings``,
    ``slicesplan.Timing``), or None without a provider; a missing image or command is a
    one-line error."""
    from gpupool.controller.sliceserver import ServerSettings
    from gpupool.controller.slicesplan import Timing

    if args.remote_provider == "none":
        return None
    if not args.slice_server_image:
        raise SystemExit("gpupool controller: --remote-provider needs --slice-server-image")
    if args.remote_provider == "lupine" and not args.lupine_server_command:
        raise SystemExit("gpupool controller: --remote-provider lupine needs "
                         "--lupine-server-command (LUPINE's server in its image)")
    env = tuple(args.lupine_server_env) or ("SCUDA_PORT={port}",)
    settings = ServerSettings(args.remote_provider, args.slice_namespace,
                              args.slice_server_image,
                              args.lupine_server_command, env, args.slice_server_cpu,
                              args.slice_server_memory, args.mps_root, args.hami_core_library)
    return settings, Timing(args.slice_lost_after, args.slice_start_deadline,
                            args.slice_retry_after, args.session_lifetime)


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
    from gpupool.kube.controller_ops import ControllerApi  # the Kubernetes client: now

    api = ControllerApi.open(kubeconfig=args.kubeconfig, server=args.server,
                             timeout_s=args.request_timeout)
    from gpupool.cli.controller_run import reconcile  # the controller's own modules

    return reconcile(args, api)
