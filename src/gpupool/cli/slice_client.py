"""``gpupool slice-client``: the sidecar of a pod's remote GPU slice.

Connects to the pod's slice server (--slice-server) over mutual TLS with the pod's
session certificate, checks that the server is the one serving this pod's slice, and
heartbeats it. While the server answers, the data plane is open on loopback (--host,
--port: the provider's client is pointed there) and /ready answers 200; a server silent
past the deadline is reported lost (/ready 503, /status says why) and the sidecar
reconnects when it answers again. Exits 0 when the server releases the slice, and 2
when the server never answers within --wait-seconds.

With --decision (the pod's gpupool.io/allocation annotation; a remote-allowed pod's
sidecar), a decision served by the pod's own node's devices leaves nothing to serve: the
sidecar reports state "local", ready at once, reads no credentials and idles until the pod
stops. See docs/remote.md.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import replace
from typing import Any

from gpupool.cli.args import add_log_level, user_text
from gpupool.cli.slice_flags import (
    PORT,
    SECONDS,
    add_credentials,
    add_timing,
    endpoint,
    log_setup,
    on_sigterm,
)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("slice-client", help="the sidecar of a remote GPU slice (in "
                              "the workload's pod)", description=user_text(__doc__),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pod-uid", required=True, metavar="UID",
                   help="uid of this pod, as its session certificate names it (required)")
    p.add_argument("--slice-server", type=endpoint, required=True, metavar="HOST:PORT",
                   help="the slice server's TLS address (required)")
    add_credentials(p, "sidecar")
    p.add_argument("--host", default="127.0.0.1", metavar="ADDRESS",
                   help="address of the data plane in the pod (default 127.0.0.1: loopback "
                        "only)")
    p.add_argument("--port", type=PORT, default=14833, metavar="PORT",
                   help="port of the data plane in the pod (default 14833)")
    p.add_argument("--status-port", type=PORT, default=14834, metavar="PORT",
                   help="port of /ready and /status (default 14834)")
    p.add_argument("--wait-seconds", type=SECONDS, default=300.0, metavar="SECONDS",
                   help="give up when the server has not answered within this at start "
                        "(default 300)")
    p.add_argument("--decision", metavar="JSON",
                   help="the pod's gpupool.io/allocation (from the downward API): serve the "
                        "slice only when the decision has servedBy, else idle, ready (default: "
                        "always serve)")
    add_timing(p)
    add_log_level(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    log_setup(args.log_level)
    return asyncio.run(_serve(args))


async def _serve(args: argparse.Namespace) -> int:
    from gpupool.remote import status
    from gpupool.remote.channel import Timing
    from gpupool.remote.client import ClientConfig, LocalSlice, SliceClient, served_remotely
    from gpupool.remote.credentials import CredentialPaths

    d = args.credentials_dir
    host, port = args.slice_server
    config = ClientConfig(args.pod_uid, host, port,
                          CredentialPaths(d / "tls.crt", d / "tls.key", d / "ca.crt"),
                          args.host, args.port,
                          Timing(args.heartbeat_seconds, args.heartbeat_deadline_seconds),
                          args.wait_seconds)
    client: SliceClient | LocalSlice = LocalSlice()
    if args.decision is None or served_remotely(args.decision, args.pod_uid):
        client = SliceClient(replace(config, credentials_later=args.decision is not None))
    endpoint_ = await status.serve(args.status_address, args.status_port, {
        "/ready": lambda: (200 if client.ready() else 503,
                           {"state": client.state, "reason": client.reason}),
        "/status": lambda: (200, client.status())})
    task = asyncio.ensure_future(client.run())
    on_sigterm(task.cancel)
    try:
        why = await task
    except asyncio.CancelledError:
        why = "the sidecar was asked to stop (SIGTERM)"
    finally:
        await client.close()
        endpoint_.close()
    print(f"gpupool slice-client: {why}", flush=True)
    return 0
