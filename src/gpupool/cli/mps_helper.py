"""``gpupool mps-helper``: set GPU compute modes for the node agent's mps provider.

NVIDIA's driver lets only a process holding CAP_SYS_ADMIN change a GPU's compute mode, and
the node agent holds no capability; this small process holds that one, on nodes whose
isolation provider is mps, and does nothing else: it answers the agent's requests
("GPU <uuid>: EXCLUSIVE_PROCESS" or "DEFAULT") on a unix socket only its own user may
open, for GPUs of its own node only. Protocol and checks:
``gpupool.nodeagent.isolation.computemode``; why it needs what it has: docs/security.md.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path
from typing import Any

from gpupool.cli.args import add_log_level, user_text
from gpupool.cli.defaults import COMPUTE_MODE_SOCKET as SOCKET

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "mps-helper", help="set GPU compute modes for the mps isolation provider (privileged)",
        description=user_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--socket", type=Path, default=SOCKET, metavar="FILE",
                   help=f"the unix socket to serve (default {SOCKET}; the node agent's "
                        "--compute-mode-socket)")
    p.add_argument("--fake-gpus", type=Path, default=None, metavar="FILE",
                   help="FAKE GPUs from a YAML file instead of NVML, for machines without "
                        "GPUs (format: docs/fake-gpus.md)")
    add_log_level(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: "
                                                     "%(message)s")
    from gpupool.cli.gpus import gpu_backend
    from gpupool.nodeagent.isolation.computemode import ComputeModeHelper

    backend = gpu_backend(args.fake_gpus)
    helper = ComputeModeHelper(args.socket, backend,
                               lambda: {g.uuid for g in backend.discover()})
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    helper.start()
    try:
        stop.wait()
    finally:
        helper.stop()
    return 0
