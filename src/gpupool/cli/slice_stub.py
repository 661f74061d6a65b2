"""``gpupool slice-stub``: the STUB data-plane provider — a stand-in, not a GPU.

A small network server in Python that speaks gpupool's toy remote-memory protocol
(allocate, free, write, read, a checksum kernel, usage; docs/remote.md, "The stub
protocol") and refuses memory beyond its limit. ``gpupool slice-server --provider
stub`` starts it on loopback for a slice; it can also be run by hand to try the
protocol. It reports the GPU its environment pins it to (CUDA_VISIBLE_DEVICES) but
uses none.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from gpupool.cli.args import add_log_level, bounded, user_text
from gpupool.cli.slice_flags import PORT, log_setup


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("slice-stub", help="run the stub data-plane provider (a "
                              "stand-in for remote-slice tests and demos)",
                              description=user_text(__doc__),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1", metavar="ADDRESS",
                   help="address to listen on (default 127.0.0.1: loopback only)")
    p.add_argument("--port", type=PORT, default=14833, metavar="PORT",
                   help="port to listen on (default 14833)")
    p.add_argument("--memory-limit-mib", type=bounded(int, 1), required=True, metavar="MIB",
                   help="memory the slice may hold, in MiB (required)")
    p.add_argument("--max-payload-mib", type=bounded(int, 1, 1024), default=16, metavar="MIB",
                   help="largest write or read in one request, in MiB (default 16)")
    add_log_level(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpupool.remote import stub

    log_setup(args.log_level)
    config = stub.StubConfig(args.memory_limit_mib * stub.MIB,
                             max_payload=args.max_payload_mib * stub.MIB,
                             device=os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    asyncio.run(stub.run(config, args.host, args.port))
    return 0
