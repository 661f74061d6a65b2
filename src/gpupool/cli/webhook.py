"""``gpupool webhook``: serve gpupool's admission webhook over HTTPS.

Refuses pods that carry gpupool's decision annotations at creation and writes of
them by anyone but gpupool's own accounts; refuses GPU pods whose containers set what
decides their GPUs and limits (NVIDIA_VISIBLE_DEVICES, CUDA_MPS_*, HAMi-core's
variables, LD_PRELOAD, GPUPOOL_*); gives GPU pods gpupool's scheduler and the implied
gpupool.io/gpu, and remote-required pods the client side of their remote GPU slice (the
slice-client sidecar, gpupool.io/remote-gpu; remote-allowed pods the sidecar alone, which
serves only a slice placed elsewhere); validates ResourceClasses and ResourceGroups.
Makes and renews its own certificate (or serves one cert-manager made: --certificates
external) and keeps the caBundle of its webhook configurations current.
See docs/webhook.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
from typing import TYPE_CHECKING, Any

from gpupool.cli.args import KUBECONFIG_HELP, add_log_level, bounded, user_text
from gpupool.contract.slices import PROVIDERS
from gpupool.webhook import sizes as port

KIB, MIB = 1024, 1024 * 1024

if TYPE_CHECKING:
    from gpupool.kube.api import KubeApi
    from gpupool.webhook.admission import Settings
    from gpupool.webhook.certificates import CertificatePlan
    from gpupool.webhook.evictions import PodNode
    from gpupool.webhook.placement import NamespaceLookup
    from gpupool.webhook.remote import RemoteSettings

CONFIGURATION = "gpupool-webhook"


def default_namespace() -> str:
    return os.environ.get("POD_NAMESPACE") or "gpupool-system"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("webhook", help="serve gpupool's admission webhook",
                              description=user_text(__doc__),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kubeconfig", metavar="FILE", help=KUBECONFIG_HELP)
    p.add_argument("--server", help=argparse.SUPPRESS)  # a bare API URL (tests, fakes)
    p.add_argument("--namespace", default=default_namespace(), metavar="NAMESPACE",
                   help="gpupool's namespace: its Secrets, Service and accounts (default: "
                        "$POD_NAMESPACE, else gpupool-system)")
    p.add_argument("--host", default="0.0.0.0", metavar="ADDRESS",
                   help="address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=bounded(int, 0, 65535), default=8443, metavar="PORT",
                   help="HTTPS port (default 8443)")
    p.add_argument("--metrics-port", type=bounded(int, 0, 65535), default=9443, metavar="PORT",
                   help="plain-HTTP Prometheus /metrics port; 0: none (default 9443)")
    p.add_argument("--service", default="gpupool-webhook", metavar="NAME",
                   help="the Service the API server calls (default gpupool-webhook)")
    p.add_argument("--tls-secret", default="gpupool-webhook-tls", metavar="NAME",
                   help="TLS Secret of the serving certificate (default gpupool-webhook-tls)")
    p.add_argument("--certificates", choices=("managed", "external"), default="managed",
                   help="managed: gpupool's CA issues and renews it and fills the caBundle; "
                        "external: serve what another issuer (cert-manager) put in the Secret "
                        "(default managed)")
    p.add_argument("--mutating-configuration", default=CONFIGURATION, metavar="NAME",
                   help=f"MutatingWebhookConfiguration to keep trusting us (default "
                        f"{CONFIGURATION})")
    p.add_argument("--validating-configuration", default=CONFIGURATION, metavar="NAME",
                   help=f"ValidatingWebhookConfiguration likewise (default {CONFIGURATION})")
    p.add_argument("--dns-name", action="append", default=[], metavar="NAME",
                   help="another DNS name for the certificate (repeatable)")
    p.add_argument("--check-seconds", type=bounded(float, 1, 86_400), default=3600.0,
                   metavar="SECONDS",
                   help="how often to check the certificate and caBundle (default 3600)")
    p.add_argument("--cert-dir", metavar="DIR",
                   help="where the served key is written (default: a new private temporary "
                        "directory)")
    p.add_argument("--scheduler-name", default="gpupool-scheduler", metavar="NAME",
                   help="scheduler given to GPU pods that name none (default gpupool-scheduler)")
    p.add_argument("--extender-account", default="gpupool-extender", metavar="NAME",
                   help="service account (in --namespace) whose Bindings carry decisions "
                        "(default gpupool-extender)")
    p.add_argument("--node-agent-account", default="gpupool-node-agent", metavar="NAME",
                   help="service account (in --namespace) that writes phase, reason, devices "
                        "(default gpupool-node-agent)")
    p.add_argument("--node-agent-decides", action="store_true",
                   help="node agents also write decisions (only with their "
                        "--decide-unscheduled, which is unsafe against hostile tenants)")
    p.add_argument("--guard", choices=("all-pods", "gpu-pods"), default="all-pods",
                   help="all-pods: also refuse NVIDIA_VISIBLE_DEVICES naming GPUs on pods that "
                        "ask no gpupool resource (default); gpu-pods: only guard GPU pods")
    p.add_argument("--controller-account", default="gpupool-controller", metavar="NAME",
                   help="service account (in --namespace) that writes the state of remote "
                        "slices' servers (default gpupool-controller)")
    z = p.add_argument_group("the HTTPS port's sizes (docs/webhook.md, \"Its port\")")
    z.add_argument("--max-header-kib", type=bounded(int, 1, 1024),
                   default=port.HEADER_BYTES // KIB, metavar="N",
                   help=f"a longer request head closes the connection (default "
                        f"{port.HEADER_BYTES // KIB})")
    z.add_argument("--request-seconds", type=bounded(float, 0, 300, above=True),
                   default=port.READ_S, metavar="SECONDS",
                   help=f"a request not whole this long after its first byte closes the "
                        f"connection (default {port.READ_S:g})")
    z.add_argument("--idle-seconds", type=bounded(float, 0, 3600, above=True),
                   default=port.IDLE_S, metavar="SECONDS",
                   help=f"a connection silent this long after its last answer is closed "
                        f"(default {port.IDLE_S:g})")
    z.add_argument("--max-connections", type=bounded(int, 1, 1_000_000),
                   default=port.MAX_CONNECTIONS, metavar="N",
                   help=f"connections held; past this the quietest is closed (default "
                        f"{port.MAX_CONNECTIONS})")
    z.add_argument("--max-body-mib", type=bounded(int, 1, 1024),
                   default=port.MAX_BODY_BYTES // MIB, metavar="MIB",
                   help=f"a larger review body is answered 413 (default "
                        f"{port.MAX_BODY_BYTES // MIB})")
    z.add_argument("--body-budget-mib", type=bounded(int, 1, 65_536),
                   default=port.BODY_BUDGET_BYTES // MIB, metavar="MIB",
                   help=f"review bodies held at once over all connections; past this a "
                        f"review is answered 429 with Retry-After (default "
                        f"{port.BODY_BUDGET_BYTES // MIB})")
    z.add_argument("--handshake-seconds", type=bounded(float, 0, 60, above=True),
                   default=port.HANDSHAKE_S, metavar="SECONDS",
                   help=f"a TLS handshake not done this long after the connection was "
                        f"accepted closes it (default {port.HANDSHAKE_S:g})")
    z.add_argument("--max-handshakes", type=bounded(int, 1, 100_000),
                   default=port.MAX_HANDSHAKES, metavar="N",
                   help=f"TLS handshakes in progress at once; past this the oldest is closed "
                        f"(default {port.MAX_HANDSHAKES})")
    r = p.add_argument_group("remote GPU slices (docs/remote.md)")
    r.add_argument("--remote-provider", choices=PROVIDERS, default="none",
                   help="the data plane of remote slices: stub (gpupool's stand-in), lupine, "
                        "or none: remote-required pods are refused, remote-allowed ones are "
                        "served by their own node (default none)")
    r.add_argument("--slice-namespace", default="gpupool-slices", metavar="NAMESPACE",
                   help="the namespace of the slice servers and their Services: the sidecars' "
                        "address (default gpupool-slices)")
    r.add_argument("--slice-client-image", default="", metavar="IMAGE",
                   help="image of the slice-client sidecar given to remote-required and "
                        "remote-allowed pods (gpupool's image; default none: required with "
                        "--remote-provider)")
    r.add_argument("--lupine-client-library", default="", metavar="PATH",
                   help="with --remote-provider lupine: LUPINE's client library in the "
                        "workloads' images, given to them as LD_PRELOAD (default: none set)")
    add_log_level(p)
    p.set_defaults(func=run)


def settings_of(args: argparse.Namespace, api: KubeApi | None = None,
                namespaces: NamespaceLookup | None = None) -> Settings:
    from gpupool.webhook.admission import Settings
    from gpupool.webhook.decisions import (
        CONTROLLER_KEYS,
        NODE_AGENT_DECIDING_KEYS,
        NODE_AGENT_KEYS,
        REPLACING_KEYS,
        Writers,
        service_account,
    )

    agent = service_account(args.namespace, args.node_agent_account)
    keys = NODE_AGENT_DECIDING_KEYS if args.node_agent_decides else NODE_AGENT_KEYS
    controller = service_account(args.namespace, args.controller_account)
    extender = service_account(args.namespace, args.extender_account)
    by_user = {agent: keys, controller: CONTROLLER_KEYS}
    if args.remote_provider != "none":  # it places lost remote slices again
        by_user[extender] = REPLACING_KEYS
    writers = Writers(by_user, frozenset({extender}))
    return Settings(args.scheduler_name, writers, args.guard == "all-pods",
                    frozenset({agent}), _pod_node(api) if api is not None else None,
                    remote_of(args), namespaces)


def sizes_of(args: argparse.Namespace) -> port.Sizes:
    """The port's sizes the flags say; a budget smaller than one body: a one-line exit."""
    if args.body_budget_mib < args.max_body_mib:
        raise SystemExit(f"gpupool webhook: --body-budget-mib ({args.body_budget_mib}) must "
                         f"hold at least one body of --max-body-mib ({args.max_body_mib})")
    return port.Sizes(header_bytes=args.max_header_kib * KIB, read_s=args.request_seconds,
                      idle_s=args.idle_seconds, max_connections=args.max_connections,
                      max_body_bytes=args.max_body_mib * MIB,
                      body_budget_bytes=args.body_budget_mib * MIB,
                      handshake_s=args.handshake_seconds,
                      max_handshakes=args.max_handshakes)


def check_remote(args: argparse.Namespace) -> None:
    """A remote provider without the sidecar's image: a one-line exit."""
    if args.remote_provider != "none" and not args.slice_client_image:
        raise SystemExit("gpupool webhook: --remote-provider needs --slice-client-image (the "
                         "image of the sidecar given to remote-slice pods)")


def remote_of(args: argparse.Namespace) -> RemoteSettings:
    from gpupool.webhook.remote import RemoteSettings

    check_remote(args)
    return RemoteSettings(args.remote_provider, args.slice_namespace, args.slice_client_image,
                          args.lupine_client_library, lambda: secrets.token_hex(8))


def _pod_node(api: KubeApi) -> PodNode:
    """Look a pod's node up (evictions by node agents), on its own connection."""
    from gpupool.kube.errors import NotFound

    def pod_node(namespace: str, name: str) -> str | None:
        try:
            pod = api.get_pod(namespace, name)
        except NotFound:
            return None
        return (pod.spec.nodeName if pod.spec else None) or ""
    return pod_node


def plan_of(args: argparse.Namespace) -> CertificatePlan:
    from gpupool.webhook.certificates import CertificatePlan

    return CertificatePlan(
        args.namespace, args.service, args.tls_secret,
        (("MutatingWebhookConfiguration", args.mutating_configuration),
         ("ValidatingWebhookConfiguration", args.validating_configuration)),
        managed=args.certificates == "managed", extra_dns_names=tuple(args.dns_name))


def run(args: argparse.Namespace) -> int:
    """Check the remote-slice flags and reach the cluster, then serve (``webhook_run``:
    the modules serving needs load only now)."""
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2"):  # one line per API request at INFO
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.root.level))
    check_remote(args)
    sizes_of(args)
    from gpupool.kube.webhook_ops import WebhookApi  # the Kubernetes client: once flags pass

    api = WebhookApi.open(kubeconfig=args.kubeconfig, server=args.server)
    from gpupool.cli.webhook_run import serve

    return serve(args, api)
