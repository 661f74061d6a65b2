"""``gpupool device-plugin``: the node agent (kubelet device plugin) for one node."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

from gpupool.core.errors import InvalidInput
from gpupool.kube.api import KubeApi
from gpupool.nodeagent.agent import AgentConfig, NodeAgent
from gpupool.nodeagent.fakegpus import FakeGpuBackend
from gpupool.nodeagent.gpu import GpuBackend
from gpupool.nodeagent.kubeview import KubeInventory, KubePods
from gpupool.nodeagent.logical import DEFAULT_MIB_PER_DEVICE, Split
from gpupool.nodeagent.nvml import NvmlGpuBackend


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "device-plugin", help="run the node agent (kubelet device plugin)",
        description="Advertise this node's GPUs to kubelet as gpupool.io/gpu logical devices, "
                    "publish GPUDevice objects and serve Allocate from the extender's decisions.")
    p.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""),
                   help="this node's name (default: $NODE_NAME)")
    p.add_argument("--kubeconfig", default=None,
                   help="kubeconfig file (default: the in-cluster service account)")
    p.add_argument("--api-server", default=None, metavar="URL",
                   help="talk to this API server URL without credentials (tests, demos)")
    p.add_argument("--kubelet-dir", type=Path, default=Path("/var/lib/kubelet"),
                   help="kubelet's directory (device-plugins/ and pod-resources/ inside)")
    p.add_argument("--fake-gpus", type=Path, default=None, metavar="FILE",
                   help="read FAKE GPUs from a YAML file instead of NVML")
    p.add_argument("--split", type=int, default=0, metavar="N",
                   help="logical devices per GPU (default: one per --mib-per-device)")
    p.add_argument("--mib-per-device", type=int, default=DEFAULT_MIB_PER_DEVICE, metavar="MIB",
                   help=f"GPU memory per logical device (default {DEFAULT_MIB_PER_DEVICE})")
    p.add_argument("--memory-unit-mib", type=int, default=256,
                   help="GPU memory accounting unit, as the extender's (default 256)")
    p.add_argument("--mps-pipe-dir", default="",
                   help="host directory of the CUDA MPS pipe, mounted into shared containers")
    p.add_argument("--heartbeat-seconds", type=float, default=30.0,
                   help="how often GPUDevice status is refreshed (default 30)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.node_name:
        raise InvalidInput("--node-name (or $NODE_NAME) is required")
    if args.heartbeat_seconds <= 0 or args.memory_unit_mib <= 0:
        raise InvalidInput("--heartbeat-seconds and --memory-unit-mib must be positive")
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: "
                                                     "%(message)s")
    config = AgentConfig(args.node_name, args.kubelet_dir,
                         Split(args.split, args.mib_per_device), args.memory_unit_mib,
                         args.mps_pipe_dir, args.heartbeat_seconds)
    backend: GpuBackend = (FakeGpuBackend(args.fake_gpus) if args.fake_gpus
                           else NvmlGpuBackend())
    api = KubeApi.connect(kubeconfig=args.kubeconfig, server=args.api_server)
    pods = KubePods(api)
    agent = NodeAgent(config, backend, pods, KubeInventory(api.fork()))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    pods.start(config.node)
    agent.start()
    try:
        stop.wait()
    finally:
        agent.stop()
        pods.stop(wait=False)
        api.close()
    return 0
