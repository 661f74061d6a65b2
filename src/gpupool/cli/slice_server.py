"""``gpupool slice-server``: serve one remote GPU slice on the GPU node.

Starts the data-plane provider (--provider stub: gpupool's stand-in; command: any
server, e.g. LUPINE's, given by --provider-command) on a loopback port, pinned to the
decided GPU (CUDA_VISIBLE_DEVICES=<uuid>) with the slice's limits in the node's
isolation provider's variables, behind gpupool's mutual-TLS terminator. Only the
sidecar of the pod the slice was decided for gets in (its session certificate,
unexpired, not revoked). Server and sidecar send each other heartbeats; when the
sidecar is silent past the deadline, or never connects, the slice is released: the
provider is stopped and nothing is held.
Status, and the slice's usage in the node agent's over-use shape, on
http://ADDRESS:STATUS-PORT/status and /usage. Exits 0 once the slice is released.
See docs/remote.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import socket
from typing import Any

from gpupool.cli.args import add_log_level, bounded, user_text
from gpupool.cli.slice_flags import (
    PORT,
    SECONDS,
    add_credentials,
    add_timing,
    log_setup,
    on_sigterm,
)
from gpupool.contract.isolation import ProviderName


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("slice-server", help="serve one remote GPU slice behind "
                              "mutual TLS (on the GPU node)", description=user_text(__doc__),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    s = p.add_argument_group("the slice, as decided")
    s.add_argument("--pod-uid", required=True, metavar="UID",
                   help="uid of the pod whose slice this is: only its sidecar gets in "
                        "(required)")
    s.add_argument("--pod-name", required=True, metavar="NAMESPACE/NAME",
                   help="the pod, for reports (required)")
    s.add_argument("--container", required=True, metavar="NAME",
                   help="the container the slice is for (required)")
    s.add_argument("--gpu-uuid", required=True, metavar="UUID",
                   help="the decided GPU (required)")
    s.add_argument("--memory-mib", type=bounded(int, 0), required=True, metavar="MIB",
                   help="the slice's GPU memory, in MiB (required)")
    s.add_argument("--core-pct", type=bounded(int, 0, 100), required=True, metavar="PCT",
                   help="the slice's share of the GPU's compute, in percent (required)")
    s.add_argument("--exclusive", action="store_true",
                   help="the slice is the whole GPU: no limits are set")
    n = p.add_argument_group("serving")
    n.add_argument("--host", default="0.0.0.0", metavar="ADDRESS",
                   help="address of the TLS port (default 0.0.0.0)")
    n.add_argument("--port", type=PORT, default=14900, metavar="PORT",
                   help="the TLS port sidecars connect to (default 14900)")
    n.add_argument("--status-port", type=PORT, default=14901, metavar="PORT",
                   help="port of /status, /usage and /healthz (default 14901)")
    add_credentials(n, "server")
    n.add_argument("--revocations", metavar="FILE",
                   help="the revocation list (a CRL signed by gpupool's CA, e.g. a mounted "
                        "ConfigMap), read again when it changes; without it nothing is "
                        "revoked")
    n.add_argument("--connect-deadline-seconds", type=SECONDS, default=300.0,
                   metavar="SECONDS",
                   help="release the slice if no sidecar connects within this (default 300)")
    add_timing(n)
    d = p.add_argument_group("the data-plane provider")
    d.add_argument("--provider", choices=("stub", "command"), default="stub",
                   help="stub: gpupool's stand-in (no GPU used); command: "
                        "--provider-command (default stub)")
    d.add_argument("--provider-command", metavar="COMMAND",
                   help="the provider's server command line (shell words; {port} is the "
                        "loopback port), for --provider command")
    d.add_argument("--provider-env", action="append", default=[], metavar="NAME=VALUE",
                   help="a variable for the provider ({port} is the loopback port), "
                        "repeatable; e.g. SCUDA_PORT={port} for LUPINE")
    d.add_argument("--loopback-port", type=PORT, default=14833, metavar="PORT",
                   help="the provider's port on loopback; 0 picks a free one (default 14833)")
    d.add_argument("--provider-start-seconds", type=SECONDS, default=30.0, metavar="SECONDS",
                   help="how long the provider may take to listen (default 30)")
    d.add_argument("--allow-exposed-provider", action="store_true",
                   help="go on when the provider listens beyond loopback (LUPINE binds every "
                        "interface): only where a NetworkPolicy admits nothing but the TLS "
                        "port to this pod")
    i = p.add_argument_group("isolation on this node")
    i.add_argument("--isolation-provider", choices=[str(n) for n in ProviderName],
                   default="none",
                   help="what enforces the slice's limits on this node, as for local "
                        "containers (default none: advisory)")
    i.add_argument("--mps-pipe-directory", metavar="DIR",
                   help="the GPU's MPS pipe directory, for --isolation-provider mps (default: "
                        "MPS's own, /tmp/nvidia-mps)")
    i.add_argument("--hami-core-library", metavar="FILE",
                   help="HAMi-core's library, preloaded into the provider, for "
                        "--isolation-provider hami-core")
    add_log_level(p)
    p.set_defaults(func=run)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(args: argparse.Namespace) -> int:
    from gpupool.core.errors import InvalidInput
    from gpupool.remote import provider as prov

    log_setup(args.log_level)
    spec = prov.SliceSpec(args.pod_uid, args.pod_name, args.container, args.gpu_uuid,
                          args.memory_mib, args.core_pct, args.exclusive)
    port = args.loopback_port or _free_port()
    isolation = prov.Isolation(ProviderName(args.isolation_provider),
                               args.mps_pipe_directory or "", args.hami_core_library or "")
    env = prov.pinned_env(os.environ, spec, isolation)
    if args.provider == "command":
        if not args.provider_command:
            raise InvalidInput("--provider command needs --provider-command")
        argv = prov.expand(shlex.split(args.provider_command), port)
    else:
        argv = prov.stub_argv(port, spec)
    for item in args.provider_env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise InvalidInput(f"--provider-env takes NAME=VALUE, got {item!r}")
        env[name] = prov.expand([value], port)[0]
    provider = prov.ProviderSpec(argv, env, port, args.provider_start_seconds,
                                 args.allow_exposed_provider)
    return asyncio.run(_serve(args, spec, provider))


async def _serve(args: argparse.Namespace, spec: Any, provider: Any) -> int:
    from pathlib import Path

    from gpupool.remote import status
    from gpupool.remote.channel import Timing
    from gpupool.remote.credentials import CredentialPaths
    from gpupool.remote.provider import ProviderProcess
    from gpupool.remote.server import ServerConfig, SliceServer

    d = args.credentials_dir
    paths = CredentialPaths(d / "tls.crt", d / "tls.key", d / "ca.crt",
                            Path(args.revocations) if args.revocations else None)
    config = ServerConfig(spec, args.host, args.port, paths,
                          Timing(args.heartbeat_seconds, args.heartbeat_deadline_seconds),
                          args.connect_deadline_seconds, stub_usage=args.provider == "stub")
    server = SliceServer(config, ProviderProcess(provider))
    endpoint = await status.serve(args.status_address, args.status_port, {
        "/status": lambda: (200, server.status()),
        "/usage": lambda: (200, server.usage_records()),
        "/healthz": lambda: (200 if server.state == "serving" else 503,
                             {"state": server.state})})
    try:
        await server.start()
        on_sigterm(lambda: asyncio.ensure_future(server.release("the server was asked to "
                                                                "stop (SIGTERM)")))
        why = await server.wait()
    finally:
        if server.state != "released":
            await server.release("the server stopped")
        endpoint.close()
    print(f"gpupool slice-server: slice of pod {spec.pod_ref} released: {why}", flush=True)
    return 0
